//! Gathering the `h2` crate's writes to the client, so that the frames of many streams
//! leave in one system call.
//!
//! The crate encodes frames into its own 16 KiB buffer and writes that buffer once per
//! flush, but only for the DATA payloads it copies: below 1,024 bytes when its I/O is not
//! vectored, 256 when it is. A larger payload is chained: the buffer and the payload are
//! written together and the crate flushes before it encodes its next frame. With vectored
//! I/O every 615-byte response was such a payload, so each stream cost a `writev` of its
//! own (HAProxy writes once per batch of streams). The client connection therefore says
//! it is not vectored; then the crate writes a chained payload as two `write`s (its buffer,
//! then the payload). [`Gather`] keeps the first, short one (up to [`GATHER`] bytes, copied
//! once) and sends it with the payload in one `writev`, or at the flush that ends every
//! batch. A long write (the crate's full buffer, a payload) is never copied.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::AsyncWrite;

/// Writes up to this many bytes (together) are held back to go out with the next write:
/// above the crate's copy threshold (1,024) plus the frames encoded before the payload
/// that follows, far below its 16 KiB buffer, so the copy stays small.
pub const GATHER: usize = 4096;

/// Short writes held back for the next write or flush of a connection.
#[derive(Debug, Default)]
pub struct Gather {
    held: Vec<u8>,
    /// The socket took bytes since [`Gather::take_moved`] was last asked: the client reads.
    moved: bool,
}

impl Gather {
    /// Takes `data`: held back when it is short, else written to `io` after (and in the
    /// same call as) what is held. Returns how many bytes of `data` were taken.
    pub fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.held.len() + data.len() <= GATHER {
            if self.held.capacity() == 0 {
                // Once, exactly: doubling growth would keep up to twice this per connection.
                self.held.reserve_exact(GATHER);
            }
            self.held.extend_from_slice(data);
            return Poll::Ready(Ok(data.len()));
        }
        self.poll_send(io, cx, data)
    }

    /// Whether the socket took any bytes since the last call (held bytes prove nothing
    /// about the client: a client that never reads must not look alive because Weir
    /// queued a small frame for it).
    pub fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.moved)
    }

    /// Writes what is held, then flushes `io`.
    pub fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_send(io, cx, &[]))?;
        Pin::new(io).poll_flush(cx)
    }

    /// Writes what is held, then shuts `io` down.
    pub fn poll_shutdown<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_send(io, cx, &[]))?;
        Pin::new(io).poll_shutdown(cx)
    }

    /// Writes what is held and as much of `data` as `io` takes in the same call. Returns
    /// how many bytes of `data` went (all of what was held is gone by then).
    fn poll_send<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        while !self.held.is_empty() {
            let both = [IoSlice::new(&self.held), IoSlice::new(data)];
            // One slice when there is no data: rustls allocates for two or more.
            let bufs = if data.is_empty() {
                &both[..1]
            } else {
                &both[..]
            };
            let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, bufs))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.moved = true;
            let old = n.min(self.held.len());
            // Rare: only a short write leaves part of what was held.
            self.held.drain(..old);
            if n > old {
                return Poll::Ready(Ok(n - old));
            }
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let written = ready!(Pin::new(io).poll_write(cx, data));
        if matches!(written, Ok(n) if n > 0) {
            self.moved = true;
        }
        Poll::Ready(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::future::poll_fn;
    use std::rc::Rc;

    use bytes::Bytes;
    use tokio::io::{AsyncRead, DuplexStream, ReadBuf};

    /// A vectored writer that takes at most `limit` bytes per call and counts the calls.
    #[derive(Default)]
    struct Recorder {
        out: Vec<u8>,
        calls: usize,
        limit: Option<usize>,
    }

    impl Recorder {
        fn take(&mut self, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
            self.calls += 1;
            let mut room = self.limit.unwrap_or(usize::MAX);
            let before = self.out.len();
            for b in bufs {
                let n = b.len().min(room);
                self.out.extend_from_slice(&b[..n]);
                room -= n;
            }
            Poll::Ready(Ok(self.out.len() - before))
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().take(&[IoSlice::new(data)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().take(bufs)
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn write_all(g: &mut Gather, io: &mut Recorder, mut data: &[u8]) {
        while !data.is_empty() {
            let n = poll_fn(|cx| g.poll_write(io, cx, data)).await;
            data = &data[n.expect("the recorder never fails")..];
        }
    }

    #[tokio::test]
    async fn a_short_write_goes_out_with_the_long_one_after_it() {
        let (mut g, mut io) = (Gather::default(), Recorder::default());
        let frames = vec![b'f'; 1100];
        let payload = vec![b'p'; 15_000];
        write_all(&mut g, &mut io, &frames).await;
        assert_eq!(io.calls, 0, "the short write is held");
        write_all(&mut g, &mut io, &payload).await;
        assert!(poll_fn(|cx| g.poll_flush(&mut io, cx)).await.is_ok());
        assert_eq!(io.calls, 1, "one writev for both");
        assert_eq!(io.out, [frames, payload].concat());
    }

    #[tokio::test]
    async fn the_flush_sends_what_is_held_and_short_writes_keep_their_order() {
        let (mut g, mut io) = (Gather::default(), Recorder::default());
        let pieces: Vec<Vec<u8>> = (0u8..10).map(|i| vec![i; 300]).collect();
        for p in &pieces {
            write_all(&mut g, &mut io, p).await;
        }
        assert!(poll_fn(|cx| g.poll_flush(&mut io, cx)).await.is_ok());
        assert_eq!(io.out, pieces.concat());
        // 10 x 300 bytes fit in one gather; an empty flush writes nothing.
        assert_eq!(io.calls, 1);
        assert!(poll_fn(|cx| g.poll_flush(&mut io, cx)).await.is_ok());
        assert_eq!(io.calls, 1);
    }

    #[tokio::test]
    async fn short_writes_of_the_socket_lose_nothing() {
        for limit in [1, 7, 1000, 4095, 4097] {
            let (mut g, mut io) = (Gather::default(), Recorder::default());
            io.limit = Some(limit);
            let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
            for piece in data.chunks(1500).chain(data.chunks(9000)) {
                write_all(&mut g, &mut io, piece).await;
            }
            assert!(poll_fn(|cx| g.poll_flush(&mut io, cx)).await.is_ok());
            assert!(poll_fn(|cx| g.poll_shutdown(&mut io, cx)).await.is_ok());
            assert_eq!(io.out, [&data[..], &data[..]].concat(), "limit {limit}");
        }
    }

    /// The server end of a pipe as `io::Prefixed` gives a client connection to the `h2`
    /// crate (not vectored, written through a `Gather`), counting the writes that reach
    /// the pipe: one per system call on a socket.
    struct Served {
        io: DuplexStream,
        gather: Gather,
        writes: Rc<Cell<usize>>,
    }

    /// The pipe as a vectored socket: one call, one count.
    struct Pipe<'a>(&'a mut DuplexStream, &'a Cell<usize>);

    impl AsyncWrite for Pipe<'_> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(data)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            this.1.set(this.1.get() + 1);
            let mut total = 0;
            for b in bufs.iter().filter(|b| !b.is_empty()) {
                match Pin::new(&mut *this.0).poll_write(cx, b) {
                    Poll::Ready(Ok(n)) if n == b.len() => total += n,
                    Poll::Ready(Ok(n)) => return Poll::Ready(Ok(total + n)),
                    _ if total > 0 => break,
                    other => return other,
                }
            }
            Poll::Ready(Ok(total))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.get_mut().0).poll_shutdown(cx)
        }
    }

    impl AsyncRead for Served {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Served {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let mut pipe = Pipe(&mut this.io, &this.writes);
            this.gather.poll_write(&mut pipe, cx, data)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let mut pipe = Pipe(&mut this.io, &this.writes);
            this.gather.poll_flush(&mut pipe, cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let mut pipe = Pipe(&mut this.io, &this.writes);
            this.gather.poll_shutdown(&mut pipe, cx)
        }
    }

    /// Sends 16 requests at once; returns the bytes of the 16 bodies and the server's
    /// writes counted once the last one arrived.
    async fn client(io: DuplexStream, writes: &Cell<usize>) -> (usize, usize) {
        let Ok((mut send, conn)) = h2::client::handshake(io).await else {
            return (0, 0);
        };
        tokio::spawn(conn);
        let mut responses = Vec::new();
        for _ in 0..16 {
            let request = http::Request::get("http://weir.test/").body(());
            let sent = send.send_request(request.unwrap_or_default(), true);
            responses.extend(sent.ok().map(|(r, _)| r));
        }
        let mut total = 0;
        for response in responses {
            let Ok(response) = response.await else {
                continue;
            };
            let mut body = response.into_body();
            while let Some(Ok(data)) = body.data().await {
                total += data.len();
                let _ = body.flow_control().release_capacity(data.len());
            }
        }
        (total, writes.get())
    }

    /// Serves 16 streams at once with `size`-byte bodies; returns the writes that reached
    /// the pipe for their responses.
    async fn writes_for_a_batch(size: usize) -> usize {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let writes = Rc::new(Cell::new(0));
        let served = Served {
            io: server_io,
            gather: Gather::default(),
            writes: writes.clone(),
        };
        let server = async {
            let mut conn = h2::server::handshake(served).await.ok()?;
            let mut streams = Vec::new();
            while streams.len() < 16 {
                let (_, respond) = conn.accept().await?.ok()?;
                streams.push(respond);
            }
            let before = writes.get();
            for mut respond in streams {
                let mut send = respond.send_response(http::Response::new(()), false).ok()?;
                send.send_data(Bytes::from(vec![b'x'; size]), true).ok()?;
            }
            while let Some(Ok(_)) = conn.accept().await {}
            Some(before)
        };
        let both = async { tokio::join!(client(client_io, &writes), server) };
        let ((total, after), before) =
            tokio::time::timeout(std::time::Duration::from_secs(10), both)
                .await
                .expect("the batch was never sent: bytes held without a flush?");
        assert_eq!(total, 16 * size);
        after - before.expect("server")
    }

    #[tokio::test]
    async fn the_responses_of_a_batch_of_streams_share_one_write() {
        // Vectored, the crate chained each 615-byte payload: 16 writes.
        let writes = writes_for_a_batch(615).await;
        assert!(writes <= 2, "{writes} writes for 16 responses of 615 bytes");
        // Above the crate's copy threshold each payload is chained and flushed: without
        // the gather its frames and the payload would be two writes each (32).
        let writes = writes_for_a_batch(1500).await;
        assert!(
            writes <= 17,
            "{writes} writes for 16 responses of 1500 bytes"
        );
    }

    /// A socket that takes bytes counts as progress; bytes only held do not.
    #[tokio::test]
    async fn only_bytes_the_socket_took_count_as_moved() {
        let (mut g, mut io) = (Gather::default(), Recorder::default());
        write_all(&mut g, &mut io, &[1; 100]).await;
        assert!(!g.take_moved(), "held, not sent");
        assert!(poll_fn(|cx| g.poll_flush(&mut io, cx)).await.is_ok());
        assert!(g.take_moved());
        assert!(!g.take_moved(), "asked once");
        write_all(&mut g, &mut io, &[2; 5000]).await;
        assert!(g.take_moved());
    }
}
