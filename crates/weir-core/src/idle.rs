//! Idle and half-close bounds of two-way relays: TCP listeners, HTTP/1.1 Upgrade tunnels
//! (WebSocket) and RFC 8441 bridges all move bytes in two directions at once, and each
//! must end when nothing has moved for a while (HAProxy's `timeout tunnel`) and when one
//! side half-closed and the other goes quiet (`timeout client-fin` / `server-fin`).
//!
//! The directions count each transfer, read or write, in an [`Activity`] (one counter
//! bump, no clock read): a slow reader that takes bytes a few at a time keeps the relay
//! open as surely as a chatty one. Bytes that leave Weir's sight (a slow reader draining
//! a full socket buffer while Weir's write waits for room) are seen through a probe of
//! the sockets' unsent bytes, and count only in steps of `min_progress` ([`Limits`]): a
//! reader that acknowledges a byte now and then is cut (HAProxy, which restarts a side's
//! timer on a successful send, is open to that slow read; Weir bounds it). One [`Watch`]
//! per relay ticks a quarter of the bound and cuts the relay once nothing moved for four
//! ticks in a row, so a still relay ends between the bound and 1.25 times it, and a busy
//! one costs a timer reset per tick, not per transfer. When a direction ends, the tighter
//! half-close bound starts from then (one clock read). [`both`] runs two direction
//! futures (TCP relays), [`one`] a single future
//! moving both ways over [`Noted`] streams (HTTP tunnels: `copy_bidirectional`, no split).

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::worker::Worker;

/// Ticks per bound: more ticks cut a still relay closer to its bound, at one timer reset
/// each per bound on every relay.
const TICKS: u32 = 4;

/// How many transfers either direction of one relay made, and whether one direction has
/// ended.
pub struct Activity {
    moves: Cell<u64>,
    half_closed: Cell<bool>,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            moves: Cell::new(0),
            half_closed: Cell::new(false),
        }
    }

    /// Notes a transfer (a read or a write that moved bytes).
    pub fn touch(&self) {
        self.moves.set(self.moves.get().wrapping_add(1));
    }

    /// Notes that a direction ended (its end of stream counts as a transfer): from now on
    /// the tighter `fin` bound applies.
    pub fn end_one(&self) {
        self.half_closed.set(true);
        self.touch();
    }
}

impl Default for Activity {
    fn default() -> Activity {
        Activity::new()
    }
}

/// The timer of one relay: compares the [`Activity`] counter at each tick with the
/// previous one.
struct Watch {
    sleep: Pin<Box<Sleep>>,
    /// The counter at the last tick that saw it move.
    seen: u64,
    /// Ticks in a row without a transfer.
    still: u32,
    /// The ticks follow the `fin` bound.
    fin: bool,
    /// The highest probe value since the last tick that saw the relay move (see
    /// [`both_probed`]): the drain since then is measured from it.
    probed: u64,
}

impl Watch {
    fn new(activity: &Activity, limits: Limits) -> Watch {
        Watch {
            sleep: Box::pin(tokio::time::sleep(tick(limits.idle))),
            seen: activity.moves.get(),
            still: 0,
            fin: false,
            probed: 0,
        }
    }

    /// Ready with the bound that ran out once the relay has been still for too long.
    fn poll_still<E>(
        &mut self,
        activity: &Activity,
        limits: Limits,
        probe: &mut impl FnMut() -> u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Cut<E>>> {
        let (limit, cut) = match activity.half_closed.get() {
            true => (limits.fin, Cut::Fin),
            false => (limits.idle, Cut::Idle),
        };
        if activity.half_closed.get() && !self.fin {
            // The half-close bound counts from the end of the direction, not from the
            // last tick: restart the ticks now.
            self.fin = true;
            self.still = 0;
            self.seen = activity.moves.get();
            self.sleep.as_mut().reset(Instant::now() + tick(limit));
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.tick(activity.moves.get(), probe(), limits.min_progress);
        if self.still >= TICKS {
            return Poll::Ready(Err(cut));
        }
        // From now, not from the tick's deadline: after a stall of the worker, ticks that
        // fell behind must not all be counted at once as still (the relay may have
        // moved meanwhile, its transfers not polled yet).
        self.sleep.as_mut().reset(Instant::now() + tick(limit));
        if self.sleep.as_mut().poll(cx).is_ready() {
            // A zero tick: come back at once rather than never.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// One tick: the relay moved if Weir saw a transfer, or if the probe (the unsent
    /// bytes of its sockets, sampled on every tick so the next compares against a fresh
    /// value) shrank by `min_progress` since the last tick that saw it move.
    fn tick(&mut self, moves: u64, probed: u64, min_progress: u64) {
        let drained = self.probed.saturating_sub(probed);
        if moves != self.seen || drained >= min_progress.max(1) {
            (self.seen, self.probed, self.still) = (moves, probed, 0);
        } else {
            // A queue that grew without a transfer Weir saw is no progress either; the
            // drain counts from its highest point.
            self.probed = self.probed.max(probed);
            self.still += 1;
        }
    }
}

/// A quarter of `limit` (see [`TICKS`]).
fn tick(limit: Duration) -> Duration {
    limit / TICKS
}

/// How long a relay may stay silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Nothing moved either way while both directions are open.
    pub idle: Duration,
    /// Nothing moved after one direction ended (a FIN, END_STREAM); the configuration
    /// keeps it at most `idle`.
    pub fin: Duration,
    /// How far the probe (the unsent bytes of a relay's sockets) must have shrunk since
    /// the last tick that saw progress to count as progress itself (`min_progress`,
    /// `tunnel_min_progress`; see [`Watch::tick`]). A reader that acknowledges a byte now
    /// and then (a slow-read attack) must not hold a relay open forever. A reader is cut
    /// when, for a whole bound, Weir could not write to it (the kernel wakes a waiting
    /// write once about a third of the send buffer is free) and it took less than this.
    pub min_progress: u64,
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
/// every transfer, read or write.
pub async fn both<E, A, B>(a: A, b: B, activity: &Activity, limits: Limits) -> Result<(), Cut<E>>
where
    A: Future<Output = Result<(), E>>,
    B: Future<Output = Result<(), E>>,
{
    both_probed(a, b, activity, limits, || 0).await
}

/// [`both`], where every tick also asks `probe` for a number that changes when bytes
/// move out of Weir's sight (the unsent bytes of the sockets written to,
/// `crate::sys::unsent`): a write waiting for room in a full socket buffer sees no
/// progress until about a third of it drained, which takes long with a slow reader.
pub async fn both_probed<E, A, B, P>(
    a: A,
    b: B,
    activity: &Activity,
    limits: Limits,
    mut probe: P,
) -> Result<(), Cut<E>>
where
    A: Future<Output = Result<(), E>>,
    B: Future<Output = Result<(), E>>,
    P: FnMut() -> u64,
{
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut a_done, mut b_done) = (false, false);
    let mut watch = Watch::new(activity, limits);
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
        watch.poll_still(activity, limits, &mut probe, cx)
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
    one_probed(relay, activity, limits, || 0).await
}

/// [`one`] with a `probe` as in [`both_probed`].
pub async fn one_probed<E, F, P>(
    relay: F,
    activity: &Activity,
    limits: Limits,
    mut probe: P,
) -> Result<(), Cut<E>>
where
    F: Future<Output = Result<(), E>>,
    P: FnMut() -> u64,
{
    let mut relay = pin!(relay);
    let mut watch = Watch::new(activity, limits);
    poll_fn(|cx| {
        if let Poll::Ready(r) = relay.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(Cut::Failed));
        }
        watch.poll_still(activity, limits, &mut probe, cx)
    })
    .await
}

/// A stream whose transfers are noted in an [`Activity`]: a read or a write that moved
/// bytes (or a completed flush, which may have moved buffered TLS records) touches it,
/// an end of stream ends one direction. Writes count too: a relay blocked on a slow
/// reader is moving bytes, not still. No lock, no allocation: the relay keeps both
/// streams in one task.
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

impl<S> Noted<'_, S> {
    /// Touches the activity when a write moved bytes.
    fn note(&self, r: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = r {
            if *n > 0 {
                self.activity.touch();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Noted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.stream).poll_write(cx, buf);
        this.note(&r);
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = r {
            this.activity.touch();
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.stream).poll_write_vectored(cx, bufs);
        this.note(&r);
        r
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
        min_progress: MIN_PROGRESS,
    };
    const MIN_PROGRESS: u64 = 16 * 1024;

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

    /// A relay that only writes, to a peer that reads a little every 8 s (less than the
    /// idle bound): the writes keep it open, though nothing is read for 150 s.
    #[tokio::test(start_paused = true)]
    async fn noted_writes_to_a_slow_reader_keep_it_open() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let activity = Activity::new();
        let (near, mut far) = tokio::io::duplex(64);
        let start = Instant::now();
        let relay = async {
            // Owned, so that a cut relay closes it and the peer sees the end.
            let mut near = near;
            let mut noted = Noted {
                stream: &mut near,
                activity: &activity,
            };
            noted.write_all(&[7u8; 64 * 20]).await?;
            noted.shutdown().await
        };
        let peer = async {
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            loop {
                tokio::time::sleep(Duration::from_secs(8)).await;
                match far.read(&mut buf).await.expect("read") {
                    0 => return got,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        let (r, got) = tokio::join!(one(relay, &activity, LIMITS), peer);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(got.len(), 64 * 20);
        assert!(Instant::now() - start >= Duration::from_secs(150));
    }

    /// One transfer at 8 s, then silence (with `probe`, which may look at the activity):
    /// the relay ends at least `idle` after the transfer and at most a tick later.
    async fn cut_after_one_transfer(probe: impl Fn(&Activity) -> u64) {
        let start = Instant::now();
        let activity = Activity::new();
        let talk = async {
            tokio::time::sleep(Duration::from_secs(8)).await;
            activity.touch();
            pending::<Result<(), ()>>().await
        };
        let r = both_probed(talk, pending(), &activity, LIMITS, || probe(&activity)).await;
        assert_eq!(r, Err(Cut::Idle));
        let still = Instant::now() - start - Duration::from_secs(8);
        assert!(still >= LIMITS.idle, "{still:?}");
        assert!(still <= LIMITS.idle + LIMITS.idle / TICKS, "{still:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn still_time_counts_from_the_last_transfer() {
        cut_after_one_transfer(|_| 0).await;
    }

    /// A transfer that changed the probe, which then stays at a non-zero value (a full
    /// queue nobody drains): the cut lands at most a tick after the bound, not a tick
    /// later still (a probe sampled only on still ticks first compared against a value
    /// from before the transfer).
    #[tokio::test(start_paused = true)]
    async fn a_constant_probe_after_a_transfer_is_still() {
        cut_after_one_transfer(|activity| 100_000 + activity.moves.get()).await;
    }

    /// A queue drained a byte per tick (a reader acknowledging a byte now and then) is
    /// no progress: the relay ends after the bound. Draining `min_progress` per bound, a
    /// reader keeps it open.
    #[tokio::test(start_paused = true)]
    async fn a_queue_must_drain_a_minimum_to_count() {
        let start = Instant::now();
        let activity = Activity::new();
        let queue = Cell::new(1u64 << 20);
        let trickle = || {
            queue.set(queue.get() - 1);
            queue.get()
        };
        let r = both_probed(
            pending::<Result<(), ()>>(),
            pending(),
            &activity,
            LIMITS,
            trickle,
        );
        assert_eq!(r.await, Err(Cut::Idle));
        assert_eq!(Instant::now() - start, LIMITS.idle);

        let start = Instant::now();
        let drain = || {
            if Instant::now() - start < Duration::from_secs(40) {
                queue.set(queue.get() - MIN_PROGRESS / 2);
            }
            queue.get()
        };
        let quiet = async {
            tokio::time::sleep(Duration::from_secs(40)).await;
            Ok::<(), ()>(())
        };
        let r = both_probed(pending(), quiet, &activity, LIMITS, drain).await;
        // Drained until `quiet` ended at 40 s, then still for the fin bound.
        assert_eq!(r, Err(Cut::Fin));
        assert!(Instant::now() - start >= Duration::from_secs(40) + LIMITS.fin);
    }

    /// A worker that stalls for longer than the bound (all ticks overdue at once) while
    /// the relay keeps moving: one tick is checked, not every overdue one, so the
    /// transfers made after the stall keep the relay open.
    #[tokio::test(start_paused = true)]
    async fn overdue_ticks_are_not_all_counted_after_a_stall() {
        let activity = Activity::new();
        let talk = async {
            activity.touch();
            tokio::time::sleep(Duration::from_secs(1)).await;
            // The worker stalls for twice the bound: every tick is overdue at once, and
            // the transfers it owes come after.
            tokio::time::advance(LIMITS.idle * 2).await;
            for _ in 0..9 {
                activity.touch();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok::<(), ()>(())
        };
        let quiet = async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        };
        let r = both(talk, quiet, &activity, LIMITS).await;
        assert_eq!(r, Ok(()));
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
