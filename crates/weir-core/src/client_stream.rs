//! The client socket, joined to the reactor only once it has to wait.
//!
//! A short connection (one request, then close) often never waits: its request is in the
//! socket when it is accepted, and the response write and the close complete at once.
//! Registering such a socket with epoll costs an `epoll_ctl(ADD)` and, when tokio drops it,
//! an `epoll_ctl(DEL)`: two of the ten system calls of a proxied short connection. So an
//! accepted socket stays a plain non-blocking socket until a read or write would block;
//! then it is registered (epoll reports the state it is in at that moment, so nothing is
//! missed) and stays registered for the rest of its life.
//!
//! A direct read or write spends the task's cooperative budget like tokio's own sockets do,
//! so a client that keeps its socket full (pipelined requests answered by the default
//! response, which touch no other socket) still yields to the rest of the worker.
//!
//! A connection to a TLS listener is registered for its handshake and then carries a
//! tokio-rustls stream (`tls::handshake` puts it here). The HTTP pipeline never flushes, so
//! this type does: ciphertext that did not fit in the socket goes out before the next
//! write (or, best effort, before the next read), and when the stream is dropped a
//! `close_notify` and whatever is left are sent, within the listener's `client_timeout`.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::coop;
use tokio_rustls::server::TlsStream;

pub struct ClientStream {
    state: State,
}

enum State {
    /// Every operation so far completed without waiting.
    Unregistered(std::net::TcpStream),
    Registered(TcpStream),
    /// After a TLS handshake; `Duration`: how long a close may take to send what is left.
    Tls(Box<TlsStream<TcpStream>>, Duration),
    /// Registration failed, or the socket is in a handshake: every operation fails.
    Gone,
}

/// What a direct attempt on the unregistered socket gave: a result, or "register and wait".
fn settled<T>(result: io::Result<T>) -> Option<io::Result<T>> {
    match result {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            None
        }
        other => Some(other),
    }
}

impl ClientStream {
    /// Wraps a non-blocking accepted socket without registering it.
    pub fn new(stream: std::net::TcpStream) -> ClientStream {
        ClientStream {
            state: State::Unregistered(stream),
        }
    }

    /// Wraps a socket already registered with the reactor (a TCP listener's connection,
    /// before its TLS handshake).
    pub fn from_registered(stream: TcpStream) -> ClientStream {
        ClientStream {
            state: State::Registered(stream),
        }
    }

    /// The socket as a registered tokio stream, registering it now if it is not yet.
    /// Registration fails only when epoll cannot take the socket (ENOMEM, or ENOSPC at
    /// `max_user_watches`); the connection then closes with that error.
    /// Inlined: every read and write of a plain connection asks (three times per proxied
    /// request), and it is registered but for the first.
    #[inline]
    pub fn registered(&mut self) -> io::Result<&mut TcpStream> {
        if matches!(self.state, State::Unregistered(_)) {
            self.register()?;
        }
        match &mut self.state {
            State::Registered(s) => Ok(s),
            _ => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the client socket could not be registered",
            )),
        }
    }

    /// Registers an unregistered socket with epoll (see [`Self::registered`]).
    #[inline(never)]
    fn register(&mut self) -> io::Result<()> {
        self.state = match std::mem::replace(&mut self.state, State::Gone) {
            State::Unregistered(s) => match TcpStream::from_std(s) {
                Ok(s) => State::Registered(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot register a client connection with epoll: closing it");
                    return Err(e);
                }
            },
            other => other,
        };
        Ok(())
    }

    /// The socket's descriptor number (for `sys::borrow_socket`); -1 once gone.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &self.state {
            State::Unregistered(s) => s.as_raw_fd(),
            State::Registered(s) => s.as_raw_fd(),
            State::Tls(s, _) => s.get_ref().0.as_raw_fd(),
            State::Gone => -1,
        }
    }

    /// Whether the socket has been registered with the reactor (for tests).
    pub fn is_registered(&self) -> bool {
        matches!(self.state, State::Registered(_))
    }

    /// Takes the socket out (registered) for a TLS handshake; the stream is unusable until
    /// [`ClientStream::set_tls`].
    pub fn take_registered(&mut self) -> io::Result<TcpStream> {
        self.registered()?;
        match std::mem::replace(&mut self.state, State::Gone) {
            State::Registered(s) => Ok(s),
            other => {
                self.state = other;
                Err(io::Error::from(io::ErrorKind::NotConnected))
            }
        }
    }

    /// From now on the connection speaks TLS through `stream`; closing it may take up to
    /// `linger` to send `close_notify` and the last ciphertext.
    pub fn set_tls(&mut self, stream: TlsStream<TcpStream>, linger: Duration) {
        self.state = State::Tls(Box::new(stream), linger);
    }

    /// The TLS session, on a TLS connection.
    pub fn tls(&self) -> Option<&rustls::ServerConnection> {
        match &self.state {
            State::Tls(s, _) => Some(s.get_ref().1),
            _ => None,
        }
    }

    /// Read and write halves usable at the same time in one task (a streamed upload while
    /// the response head is awaited). Registers a plain socket.
    pub fn split(&mut self) -> io::Result<(ClientReadHalf<'_>, ClientWriteHalf<'_>)> {
        if let State::Tls(..) = self.state {
            let (r, w) = tokio::io::split(self);
            return Ok((ClientReadHalf::Tls(r), ClientWriteHalf::Tls(w)));
        }
        let (r, w) = self.registered()?.split();
        Ok((ClientReadHalf::Plain(r), ClientWriteHalf::Plain(w)))
    }

    /// Sends up to `len` bytes of the file `file` from `*offset` (advanced by what went)
    /// with sendfile(2): from the page cache to the socket, nothing read into user space.
    /// A plain socket only: over TLS it fails with `Unsupported` (the bytes must be
    /// encrypted here).
    pub fn poll_sendfile(
        &mut self,
        cx: &mut Context<'_>,
        file: std::os::fd::BorrowedFd<'_>,
        offset: &mut i64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        use std::os::fd::AsFd;
        let send = |socket: std::os::fd::BorrowedFd<'_>, offset: &mut i64| {
            crate::sys::sendfile(socket, file, offset, len)
        };
        if let Some(done) = self.try_direct(cx, |s| send(s.as_fd(), &mut *offset)) {
            return done;
        }
        if let State::Tls(..) = self.state {
            return Poll::Ready(Err(io::ErrorKind::Unsupported.into()));
        }
        let s = match self.registered() {
            Ok(s) => s,
            Err(e) => return Poll::Ready(Err(e)),
        };
        loop {
            std::task::ready!(s.poll_write_ready(cx))?;
            let socket = s.as_fd();
            match s.try_io(tokio::io::Interest::WRITABLE, || send(socket, &mut *offset)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    /// The unregistered socket, if it still is.
    fn direct(&mut self) -> Option<&std::net::TcpStream> {
        match &self.state {
            State::Unregistered(s) => Some(s),
            _ => None,
        }
    }

    /// `op` straight on the unregistered socket, within the task's cooperative budget.
    /// `None` when the socket is registered or `op` would block: the registered path then
    /// takes over (and waits).
    fn try_direct<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(&std::net::TcpStream) -> io::Result<T>,
    ) -> Option<Poll<io::Result<T>>> {
        let s = self.direct()?;
        let Poll::Ready(budget) = coop::poll_proceed(cx) else {
            return Some(Poll::Pending);
        };
        let result = settled(op(s))?;
        budget.made_progress();
        Some(Poll::Ready(result))
    }

    /// Polls `op` on the registered stream (registering first).
    fn poll_registered<T>(
        &mut self,
        op: impl FnOnce(Pin<&mut TcpStream>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match self.registered() {
            Ok(s) => op(Pin::new(s)),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(done) = this.try_direct(cx, |mut s| s.read(buf.initialize_unfilled())) {
            return done.map_ok(|n| buf.advance(n));
        }
        if let State::Tls(s, _) = &mut this.state {
            // Best effort: a response's tail still in rustls goes out while we wait to read.
            let _ = Pin::new(&mut **s).poll_flush(cx);
            return Pin::new(&mut **s).poll_read(cx, buf);
        }
        this.poll_registered(|s| s.poll_read(cx, buf))
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(done) = this.try_direct(cx, |mut s| s.write(data)) {
            return done;
        }
        if let State::Tls(s, _) = &mut this.state {
            std::task::ready!(Pin::new(&mut **s).poll_flush(cx))?;
            return Pin::new(&mut **s).poll_write(cx, data);
        }
        this.poll_registered(|s| s.poll_write(cx, data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(done) = this.try_direct(cx, |mut s| s.write_vectored(bufs)) {
            return done;
        }
        if let State::Tls(s, _) = &mut this.state {
            std::task::ready!(Pin::new(&mut **s).poll_flush(cx))?;
            return Pin::new(&mut **s).poll_write_vectored(cx, bufs);
        }
        this.poll_registered(|s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            State::Registered(s) => Pin::new(s).poll_flush(cx),
            State::Tls(s, _) => Pin::new(&mut **s).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(s) = this.direct() {
            return Poll::Ready(s.shutdown(Shutdown::Write));
        }
        if let State::Tls(s, _) = &mut this.state {
            return Pin::new(&mut **s).poll_shutdown(cx);
        }
        this.poll_registered(|s| s.poll_shutdown(cx))
    }
}

impl Drop for ClientStream {
    /// A TLS connection ends with `close_notify` after the last ciphertext: sent at once
    /// when the socket takes it (the usual case), else by a task that gives up after the
    /// linger time.
    fn drop(&mut self) {
        let State::Tls(mut stream, linger) = std::mem::replace(&mut self.state, State::Gone) else {
            return;
        };
        let (tcp, session) = stream.get_mut();
        session.send_close_notify();
        while session.wants_write() {
            match session.write_tls(&mut TryWriter(tcp)) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return,
            }
        }
        if !session.wants_write() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                use tokio::io::AsyncWriteExt;
                let _ = tokio::time::timeout(linger, stream.flush()).await;
            });
        }
    }
}

/// `io::Write` on a registered socket without waiting (`WouldBlock` when it is full).
struct TryWriter<'a>(&'a TcpStream);

impl Write for TryWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0.try_write(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The read half of [`ClientStream::split`].
pub enum ClientReadHalf<'a> {
    Plain(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut ClientStream>),
}

/// The write half of [`ClientStream::split`].
pub enum ClientWriteHalf<'a> {
    Plain(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut ClientStream>),
}

forward_read!(ClientReadHalf<'_>, Plain, Tls);
forward_write!(ClientWriteHalf<'_>, Plain, Tls);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair: (client side, accepted side as a non-blocking std socket).
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn serves_what_is_there_without_registering() {
        let (mut c, s) = pair();
        c.write_all(b"hello").unwrap();
        let mut s = ClientStream::new(s);
        let mut got = [0u8; 5];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        s.write_all(b"world").await.unwrap();
        assert!(!s.is_registered());
        let mut back = [0u8; 5];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"world");
    }

    #[tokio::test]
    async fn registers_when_a_read_would_block_and_then_gets_the_data() {
        let (mut c, s) = pair();
        let mut s = ClientStream::new(s);
        let mut got = [0u8; 3];
        // Nothing has been sent: the read must wait, which registers the socket.
        let waited = std::future::poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut got);
            Poll::Ready(Pin::new(&mut s).poll_read(cx, &mut rb).is_pending())
        })
        .await;
        assert!(waited);
        assert!(s.is_registered());
        c.write_all(b"end").unwrap();
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"end");
    }

    #[tokio::test]
    async fn a_connection_that_never_waits_still_yields_to_other_tasks() {
        let (mut c, s) = pair();
        // More bytes than one task budget of reads, all there before the first read: without
        // the budget the loop below would read them all without letting `other` run.
        c.write_all(&[b'x'; 4096]).unwrap();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let other =
            tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        let mut s = ClientStream::new(s);
        let mut one = [0u8; 1];
        let mut reads = 0;
        while reads < 4096 && !ran.load(std::sync::atomic::Ordering::SeqCst) {
            s.read_exact(&mut one).await.unwrap();
            reads += 1;
        }
        assert!(
            ran.load(std::sync::atomic::Ordering::SeqCst),
            "the other task never ran"
        );
        assert!(reads < 4096, "yielded only after {reads} reads");
        assert!(!s.is_registered(), "every read found data");
        other.await.unwrap();
    }

    #[tokio::test]
    async fn reports_end_of_stream_and_shuts_down_writes() {
        let (mut c, s) = pair();
        let mut s = ClientStream::new(s);
        c.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        s.shutdown().await.unwrap();
        let mut tail = Vec::new();
        c.read_to_end(&mut tail).unwrap();
        assert!(tail.is_empty());
    }
}
