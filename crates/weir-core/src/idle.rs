//! Idle and half-close bounds of two-way relays: TCP listeners, HTTP/1.1 Upgrade tunnels
//! (WebSocket) and RFC 8441 bridges all move bytes in two directions at once, and each
//! must end when nothing has moved for a while (HAProxy's `timeout tunnel`) and when one
//! side half-closed and the other goes quiet (`timeout client-fin` / `server-fin`).
//!
//! The directions note each transfer in an [`Activity`] (a clock read and a store); one
//! [`LazyTimer`] per relay watches it and is moved only when it fires or when a direction
//! ends (the tighter half-close bound starts then), not on every transfer. [`both`] runs
//! two direction futures (TCP relays), [`one`] a single future moving both ways over
//! [`Noted`] streams (HTTP tunnels: `copy_bidirectional`, no split).

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::time::LazyTimer;
use crate::worker::Worker;

/// The time of the latest transfer in either direction of one relay, and whether one
/// direction has ended.
pub struct Activity {
    last: Cell<Instant>,
    half_closed: Cell<bool>,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            last: Cell::new(Instant::now()),
            half_closed: Cell::new(false),
        }
    }

    /// Notes a transfer now.
    pub fn touch(&self) {
        self.last.set(Instant::now());
    }

    /// Notes that a direction ended (its end of stream counts as a transfer): from now on
    /// the tighter `fin` bound applies.
    pub fn end_one(&self) {
        self.half_closed.set(true);
        self.touch();
    }

    /// Ready with the bound that ran out once the relay has been still for too long.
    fn poll_still<E>(
        &self,
        timer: &mut LazyTimer,
        limits: Limits,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Cut<E>>> {
        let (limit, cut) = match self.half_closed.get() {
            true => (limits.fin.min(limits.idle), Cut::Fin),
            false => (limits.idle, Cut::Idle),
        };
        timer.set(self.last.get() + limit);
        timer.poll_expired(cx).map(|()| Err(cut))
    }
}

impl Default for Activity {
    fn default() -> Activity {
        Activity::new()
    }
}

/// How long a relay may stay silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Nothing moved either way while both directions are open.
    pub idle: Duration,
    /// Nothing moved after one direction ended (a FIN, END_STREAM); at most `idle`.
    pub fin: Duration,
}

/// Why a relay ended before both directions finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut<E> {
    /// A direction failed with this error.
    Failed(E),
    /// Both directions open, nothing moved for `idle`.
    Idle,
    /// One direction ended, nothing moved for `fin` since.
    Fin,
}

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides closed their sending side.
    Closed,
    /// A socket error (usually a reset) on either side.
    Error,
    /// Nothing moved either way for the idle bound.
    Idle,
    /// One side half-closed and nothing moved for the fin bound since.
    Fin,
}

impl<E> From<Result<(), Cut<E>>> for End {
    fn from(r: Result<(), Cut<E>>) -> End {
        match r {
            Ok(()) => End::Closed,
            Err(Cut::Failed(_)) => End::Error,
            Err(Cut::Idle) => End::Idle,
            Err(Cut::Fin) => End::Fin,
        }
    }
}

/// Counts a relay of the listener with metric slot `slot` that a still-time bound ended
/// (`weir_tunnel_timeouts_total`).
pub fn count(worker: &Worker, slot: usize, end: End) {
    let reason = match end {
        End::Idle => 0,
        End::Fin => 1,
        End::Closed | End::Error => return,
    };
    if let Some(m) = worker.metrics.listener(slot) {
        m.tunnel_timeouts[reason].inc();
    }
}

/// Runs both directions `a` and `b` until both complete, one fails, or `activity` has
/// been still for too long (see [`Limits`]). The directions must `touch` `activity` on
/// every transfer.
pub async fn both<E, A, B>(a: A, b: B, activity: &Activity, limits: Limits) -> Result<(), Cut<E>>
where
    A: Future<Output = Result<(), E>>,
    B: Future<Output = Result<(), E>>,
{
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut a_done, mut b_done) = (false, false);
    let mut timer = LazyTimer::new(activity.last.get());
    poll_fn(|cx| {
        if !a_done {
            if let Poll::Ready(r) = a.as_mut().poll(cx) {
                r.map_err(Cut::Failed)?;
                a_done = true;
                activity.end_one();
            }
        }
        if !b_done {
            if let Poll::Ready(r) = b.as_mut().poll(cx) {
                r.map_err(Cut::Failed)?;
                b_done = true;
                activity.end_one();
            }
        }
        if a_done && b_done {
            return Poll::Ready(Ok(()));
        }
        activity.poll_still(&mut timer, limits, cx)
    })
    .await
}

/// Runs `relay` (both directions in one future, such as `copy_bidirectional` over
/// [`Noted`] streams, which report transfers and ends) until it completes, fails, or
/// `activity` has been still for too long.
pub async fn one<E, F>(relay: F, activity: &Activity, limits: Limits) -> Result<(), Cut<E>>
where
    F: Future<Output = Result<(), E>>,
{
    let mut relay = pin!(relay);
    let mut timer = LazyTimer::new(activity.last.get());
    poll_fn(|cx| {
        if let Poll::Ready(r) = relay.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(Cut::Failed));
        }
        activity.poll_still(&mut timer, limits, cx)
    })
    .await
}

/// A stream whose reads are noted in an [`Activity`]: a read that moved bytes touches it,
/// an end of stream ends one direction. Writes pass through untouched (the bytes were
/// noted when read). No lock, no allocation: the relay keeps both streams in one task.
pub struct Noted<'a, S> {
    pub stream: &'a mut S,
    pub activity: &'a Activity,
}

impl<S: AsyncRead + Unpin> AsyncRead for Noted<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let r = Pin::new(&mut *this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            match buf.filled().len() > before {
                true => this.activity.touch(),
                // Nothing read into room for it: the end of the stream.
                false if room => this.activity.end_one(),
                false => {}
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Noted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    const LIMITS: Limits = Limits {
        idle: Duration::from_secs(10),
        fin: Duration::from_secs(3),
    };

    #[tokio::test(start_paused = true)]
    async fn silent_relay_ends_after_idle() {
        let start = Instant::now();
        let activity = Activity::new();
        let a = pending::<Result<(), ()>>();
        let b = pending::<Result<(), ()>>();
        assert_eq!(both(a, b, &activity, LIMITS).await, Err(Cut::Idle));
        assert_eq!(Instant::now() - start, LIMITS.idle);
    }

    #[tokio::test(start_paused = true)]
    async fn transfers_keep_it_open() {
        let start = Instant::now();
        let activity = Activity::new();
        let talk = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                activity.touch();
            }
            Ok(())
        };
        let quiet = async {
            tokio::time::sleep(Duration::from_secs(40)).await;
            Ok::<(), ()>(())
        };
        assert_eq!(both(talk, quiet, &activity, LIMITS).await, Ok(()));
        assert_eq!(Instant::now() - start, Duration::from_secs(40));
    }

    #[tokio::test(start_paused = true)]
    async fn half_closed_tail_ends_after_fin() {
        let start = Instant::now();
        let activity = Activity::new();
        let ends = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        };
        let b = pending::<Result<(), ()>>();
        assert_eq!(both(ends, b, &activity, LIMITS).await, Err(Cut::Fin));
        assert_eq!(Instant::now() - start, Duration::from_secs(5) + LIMITS.fin);
    }

    /// A relay over `Noted` streams: reads keep it open, the peer's end of stream starts
    /// the `fin` bound.
    #[tokio::test(start_paused = true)]
    async fn noted_reads_and_ends_drive_the_bounds() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let activity = Activity::new();
        let (mut near, mut far) = tokio::io::duplex(64);
        let start = Instant::now();
        let relay = async {
            let mut noted = Noted {
                stream: &mut near,
                activity: &activity,
            };
            let mut buf = [0u8; 8];
            while noted.read(&mut buf).await? > 0 {}
            std::future::pending::<io::Result<()>>().await
        };
        let peer = async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                far.write_all(b"x").await.expect("write");
            }
            far.shutdown().await.expect("shutdown");
            std::future::pending::<()>().await
        };
        let r = tokio::select! {
            r = one(relay, &activity, LIMITS) => r,
            () = peer => unreachable!(),
        };
        assert!(matches!(r, Err(Cut::Fin)), "{r:?}");
        assert_eq!(Instant::now() - start, Duration::from_secs(24) + LIMITS.fin);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_ends_both() {
        let activity = Activity::new();
        let fails = async { Err::<(), _>(7) };
        assert_eq!(
            both(fails, pending(), &activity, LIMITS).await,
            Err(Cut::Failed(7))
        );
    }
}
