//! One admin connection: hyper's HTTP/1 server, closed when the client keeps it waiting.
//!
//! hyper 1.x has a header read timeout but no keep-alive idle timeout, and its header
//! timeout runs from the moment it starts waiting for a head (so after a response it is
//! the idle timeout too). The admin listener wants both, like the data plane: a whole
//! request head within `header_timeout` (counted from the accept for the first request,
//! from its first byte for later ones) and at most `idle_timeout` between requests or while
//! a response waits for the client to take it. A [`Clock`] follows the connection's phase
//! from the bytes moving through [`Watched`] and from the service (a request is handled
//! between the head and the response), and [`serve`] drops the connection when the
//! deadline of its phase passes, or when the cap hands its slot to a newcomer
//! ([`Clock::evict`], see `slots`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The admin listener's per-connection limits (`[admin]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    pub fn of(settings: &weir_config::AdminSettings) -> Limits {
        Limits {
            header_timeout: settings.header_timeout,
            idle_timeout: settings.idle_timeout,
            max_connections: settings.max_connections,
        }
    }
}

/// Where a connection is, as far as its timeouts go.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for a request's first byte, or for the client to take a response, since
    /// `since` (the accept, the end of the last request, or the last byte written).
    Waiting { since: Instant, first: bool },
    /// The first bytes of a request head arrived at `since` (`first`: the connection's
    /// first request).
    Head { since: Instant, first: bool },
    /// An API request's body is being read: `api` bounds the read (`header_timeout`), and
    /// the connection is not held against eviction (see `slots`).
    Body,
    /// A request is being handled: the handler bounds its own waits (see `api`).
    Busy,
}

/// The phase of one connection, shared by its socket, its service and its watchdog.
#[derive(Debug)]
pub struct Clock {
    phase: Mutex<Phase>,
    /// Told when the deadline may have come earlier (or appeared), or on eviction.
    changed: Notify,
    /// The connection's slot went to a newcomer: close it now.
    evicted: AtomicBool,
}

impl Clock {
    pub fn new() -> Arc<Clock> {
        Arc::new(Clock {
            phase: Mutex::new(Phase::Waiting {
                since: Instant::now(),
                first: true,
            }),
            changed: Notify::new(),
            evicted: AtomicBool::new(false),
        })
    }

    /// Closes the connection: its slot was given to a newcomer.
    pub fn evict(&self) {
        self.evicted.store(true, Ordering::Relaxed);
        self.changed.notify_one();
    }

    #[cfg(test)]
    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Marks a request as being handled until the guard drops (the response is ready).
    pub fn busy(self: &Arc<Clock>) -> BusyGuard {
        self.set(Phase::Busy);
        BusyGuard(self.clone())
    }

    /// Marks an API request's body as being read (see [`Phase::Body`]).
    pub fn reading_body(&self) {
        self.set(Phase::Body);
    }

    fn read(&self) {
        let mut phase = self.lock();
        if let Phase::Waiting { since, first } = *phase {
            // A connection's first head is timed from the accept: trickling a byte just
            // before the deadline buys no more time.
            let since = if first { since } else { Instant::now() };
            *phase = Phase::Head { since, first };
            drop(phase);
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        // Only ever moves the deadline later: the watchdog finds out when it wakes.
        if let Phase::Waiting { since, .. } = &mut *self.lock() {
            *since = Instant::now();
        }
    }

    fn set(&self, phase: Phase) {
        *self.lock() = phase;
        self.changed.notify_one();
    }

    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        match *self.lock() {
            Phase::Waiting { since, first: true } => Some(since + limits.header_timeout),
            Phase::Waiting { since, .. } => Some(since + limits.idle_timeout),
            Phase::Head { since, .. } => Some(since + limits.header_timeout),
            Phase::Body | Phase::Busy => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns once the deadline of the current phase has passed, or on eviction.
    async fn expired(&self, limits: &Limits) {
        loop {
            if self.evicted.load(Ordering::Relaxed) {
                return;
            }
            match self.deadline(limits) {
                Some(at) if at <= Instant::now() => return,
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

/// Ends a request's `Busy` phase: the connection waits for the client again.
pub struct BusyGuard(Arc<Clock>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.set(Phase::Waiting {
            since: Instant::now(),
            first: false,
        });
    }
}

/// A socket that tells its [`Clock`] when bytes move.
pub struct Watched<T> {
    io: T,
    clock: Arc<Clock>,
}

impl<T> Watched<T> {
    pub fn new(io: T, clock: Arc<Clock>) -> Watched<T> {
        Watched { io, clock }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.clock.read();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        if n > 0 {
            self.clock.wrote();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs))?;
        if n > 0 {
            self.clock.wrote();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Runs `connection` (hyper's, over a [`Watched`] socket of `clock`) until it ends or its
/// phase's deadline passes or it is evicted; dropping it then closes the socket.
pub async fn serve<F: std::future::Future>(connection: F, clock: &Clock, limits: &Limits) {
    tokio::select! {
        _ = connection => {}
        _ = clock.expired(limits) => {
            tracing::debug!("admin connection timed out or evicted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_connections: 1,
    };

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let clock = Clock::new();
        let start = Instant::now();
        // A new connection gets header_timeout for its first head...
        assert_eq!(clock.deadline(&LIMITS), Some(start + LIMITS.header_timeout));
        tokio::time::advance(Duration::from_secs(3)).await;
        clock.read();
        // ...counted from the accept, not from its first byte.
        let first_head = start + LIMITS.header_timeout;
        assert_eq!(clock.deadline(&LIMITS), Some(first_head));
        drop(clock.busy());
        tokio::time::advance(Duration::from_secs(3)).await;
        // A later head: from its first byte.
        clock.read();
        let head = Instant::now() + LIMITS.header_timeout;
        assert_eq!(clock.deadline(&LIMITS), Some(head));
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.read();
        assert_eq!(clock.deadline(&LIMITS), Some(head), "more head bytes");
        let busy = clock.busy();
        assert_eq!(clock.deadline(&LIMITS), None, "handling a request");
        tokio::time::advance(Duration::from_secs(600)).await;
        drop(busy);
        let idle = Instant::now() + LIMITS.idle_timeout;
        assert_eq!(clock.deadline(&LIMITS), Some(idle), "keep-alive wait");
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.wrote();
        assert_eq!(
            clock.deadline(&LIMITS),
            Some(idle + Duration::from_secs(1)),
            "response bytes taken"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expires_at_the_deadline_of_the_current_phase() {
        let clock = Clock::new();
        let start = Instant::now();
        clock.expired(&LIMITS).await;
        assert_eq!(Instant::now(), start + LIMITS.header_timeout);

        // An idle wait cut short by a head whose deadline comes earlier.
        let clock = Clock::new();
        drop(clock.busy());
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.expired(&LIMITS).await })
        };
        tokio::time::advance(Duration::from_secs(1)).await;
        let read_at = Instant::now();
        clock.read();
        waiter.await.unwrap();
        assert_eq!(Instant::now(), read_at + LIMITS.header_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_ends_the_wait() {
        let clock = Clock::new();
        let start = Instant::now();
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.expired(&LIMITS).await })
        };
        tokio::task::yield_now().await;
        clock.evict();
        waiter.await.unwrap();
        assert_eq!(
            Instant::now(),
            start,
            "evicted at once, not at the deadline"
        );
    }
}
