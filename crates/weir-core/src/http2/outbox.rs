//! The bound on a connection's response DATA held by the `h2` crate
//! (`http2.max_connection_send_buffer`): bytes the streams handed to it and it has not yet
//! written to the client's socket.
//!
//! The `h2` crate bounds what it buffers per stream (`max_send_buffer`), not per
//! connection: a client that opens `max_concurrent_streams` streams for large responses,
//! opens its windows wide and never reads would make Weir hold their product (32 MiB with
//! the defaults) until `stall_timeout`. Here each stream's hand-off is counted (`send`,
//! and `files` for a file read within the window) and each DATA payload byte written is
//! taken off as it passes (`io`, through the outbound `frames::Scanner`); while the count
//! is at the bound, streams wait for room.
//!
//! The count is kept per stream, by stream id, because bytes may also be dropped unwritten:
//! a reset (the client's RST_STREAM, or one Weir writes) makes the `h2` crate discard what
//! the stream still had queued. Both resets pass the scanners, and the reset stream's
//! bytes leave the count there. A stream's entry lives from its task's start
//! ([`Outbox::open`]) until its task ended and its bytes are written or dropped
//! ([`Outbox::close`]); once reset, the stream hands nothing more ([`within`] ends it):
//! the `h2` crate may read a client's RST_STREAM long after it passed here (not while a
//! PING ACK waits for a socket the client does not read), and would hold, uncounted,
//! what the stream handed meanwhile.
//!
//! No deadlock: the connection task writes whatever the `h2` crate holds without waiting
//! on any stream, and waiters are woken as the count falls to half the bound, so a stream
//! whose own bytes are all that is held goes on once they are written (a stream waits for
//! room for at most a DATA frame of the default size, [`MIN_PIECE`], which the least bound
//! holds). No stream passes those that wait (but for a stream's first piece, which goes
//! at once up to half the bound over it: [`Outbox::room_for`]): while one waits,
//! newcomers wait behind it (woken together, oldest first). A wait ends with the stream's reset, or after
//! `stall_timeout` in which the connection wrote no DATA at all.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use h2::SendStream;
use tokio::sync::Notify;

use super::conn::Shared;
use super::send::{unless_reset, Stop};
use crate::error::ProxyError;
use crate::time::with_timeout;

/// The least piece a stream waits room for (or all it has, when less): a DATA frame of the
/// default size, so that the room left under the bound is not handed out in dribbles
/// (tiny DATA frames, which would make a client's tiny WINDOW_UPDATEs look like the data
/// dribble of CVE-2019-9511). No more than the least bound, so room for it always comes.
pub const MIN_PIECE: usize = 16 * 1024;

/// A stream's bytes held by the `h2` crate.
#[derive(Debug, Clone, Copy)]
struct Held {
    id: u32,
    bytes: usize,
    /// Its task still runs (it may hand more).
    running: bool,
    /// Reset: what it held was dropped, and what it hands now will be.
    reset: bool,
    /// It handed bytes before: its first [`MIN_PIECE`] went, bound or not.
    started: bool,
}

/// One connection's count of response DATA held by the `h2` crate.
#[derive(Debug, Default)]
pub struct Outbox {
    limit: usize,
    /// Bytes held, all streams together (the sum of `streams`).
    held: Cell<usize>,
    streams: RefCell<Vec<Held>>,
    /// DATA payload bytes written so far: a wait with no progress for `stall_timeout`
    /// ends.
    written: Cell<u64>,
    /// Streams waiting for room; while any does, newcomers wait too.
    waiting: Cell<u32>,
    /// Counts the wake-ups, so that a waiter that leaves can tell whether it was counted
    /// in `waiting` still.
    round: Cell<u64>,
    room: Notify,
}

impl Outbox {
    pub fn new(limit: u32) -> Outbox {
        Outbox {
            limit: limit as usize,
            ..Outbox::default()
        }
    }

    /// The stream `id`'s task starts.
    pub fn open(&self, id: u32) {
        self.streams.borrow_mut().push(Held {
            id,
            bytes: 0,
            running: true,
            reset: false,
            started: false,
        });
    }

    /// The stream `id`'s task ended: its entry goes once nothing of it is held.
    pub fn close(&self, id: u32) {
        self.with(id, |h| {
            h.running = false;
            0
        });
    }

    /// Bytes that may be handed now without waiting, when at least `least` may (0: wait,
    /// [`Outbox::room`]).
    #[inline]
    pub fn room_now(&self, least: usize) -> usize {
        let room = self.limit.saturating_sub(self.held.get());
        match self.waiting.get() {
            0 if room >= least => room,
            _ => 0,
        }
    }

    /// Whether an RST_STREAM of the stream `id` passed (`io`).
    fn was_reset(&self, id: u32) -> bool {
        let streams = self.streams.borrow();
        streams.iter().rev().any(|h| h.id == id && h.reset)
    }

    /// Bytes the stream `id` may hand now, when at least `least` may (0: wait), as
    /// [`Outbox::room_now`]; but a stream's first piece, up to [`MIN_PIECE`], goes at
    /// once, bound or not, so that a small answer (an API call's, a gRPC message) does
    /// not queue behind large downloads the client reads slowly, as it did not before the
    /// bound (the `h2` crate interleaves the streams it holds). The bound is then exceeded
    /// by at most half of it and a piece.
    /// `None`: an RST_STREAM of it passed, so it hands nothing more.
    fn room_for(&self, id: u32, least: usize) -> Option<usize> {
        let streams = self.streams.borrow();
        let fresh = match streams.iter().rev().find(|h| h.id == id) {
            Some(h) if h.reset => return None,
            Some(h) => !h.started,
            None => false,
        };
        drop(streams);
        let room = self.room_now(least);
        // The allowance stops at half the bound over it, however many streams the
        // listener lets a client open (`max_concurrent_streams` goes to 65,535).
        let allowed = fresh && self.held.get() < self.limit + self.limit / 2;
        Some(match allowed {
            true => room.max(MIN_PIECE),
            false => room,
        })
    }

    /// The stream `id` handed `n` bytes to the `h2` crate.
    #[inline]
    pub fn handed(&self, id: u32, n: usize) {
        let added = self.with(id, |h| match h.reset {
            true => 0,
            false => {
                h.bytes += n;
                h.started = true;
                n
            }
        });
        self.held.set(self.held.get() + added);
    }

    /// `n` DATA payload bytes of the stream `id` were written (`io`).
    #[inline]
    pub fn wrote(&self, id: u32, n: usize) {
        self.written.set(self.written.get() + n as u64);
        let taken = self.with(id, |h| {
            let taken = n.min(h.bytes);
            h.bytes -= taken;
            taken
        });
        self.release(taken);
    }

    /// An RST_STREAM for the stream `id` passed, either way: the `h2` crate drops what
    /// the stream still had queued, and what it hands from now on.
    pub fn reset(&self, id: u32) {
        let dropped = self.with(id, |h| {
            h.reset = true;
            std::mem::take(&mut h.bytes)
        });
        self.release(dropped);
        if self.waiting.get() > 0 {
            // The reset stream may be among the waiters: it ends now (`room`), not after
            // `stall_timeout`, when the `h2` crate has not read its reset yet. The others
            // wait again (their seats stay counted: no new round).
            self.room.notify_waiters();
        }
    }

    /// Runs `f` on the stream `id`'s entry, if it has one; removes the entry when its
    /// task ended and nothing of it is held. Returns what `f` does.
    fn with(&self, id: u32, f: impl FnOnce(&mut Held) -> usize) -> usize {
        let mut streams = self.streams.borrow_mut();
        // From the end: the newest streams are the likeliest to send.
        let Some(at) = streams.iter().rposition(|h| h.id == id) else {
            return 0;
        };
        let h = &mut streams[at];
        let out = f(h);
        if !h.running && (h.bytes == 0 || h.reset) {
            streams.swap_remove(at);
        }
        out
    }

    /// `n` bytes are no longer held: the waiters go on once at most half the bound is.
    #[inline]
    fn release(&self, n: usize) {
        let held = self.held.get() - n;
        self.held.set(held);
        if self.waiting.get() > 0 && held <= self.limit / 2 {
            self.waiting.set(0);
            self.round.set(self.round.get() + 1);
            self.room.notify_waiters();
        }
    }

    /// Waits for room for the stream `id` to hand at least `least` bytes (at most
    /// [`MIN_PIECE`]) to the `h2` crate, unless the stream `send` is reset first (or an
    /// RST_STREAM of it passed `io`) or the connection writes no DATA for
    /// `stall`. Returns how many bytes may go.
    pub async fn room(
        &self,
        id: u32,
        send: &mut SendStream<Bytes>,
        stall: Duration,
        least: usize,
    ) -> Result<usize, Stop> {
        loop {
            // Woken by its own reset (which gave its bytes back): it hands nothing more.
            if self.was_reset(id) {
                return Err(Stop::Reset);
            }
            let room = self.room_now(least);
            if room > 0 {
                return Ok(room);
            }
            let written = self.written.get();
            let _seat = Seat::take(self);
            let woken = unless_reset(|cx| send.poll_reset(cx), self.room.notified());
            match with_timeout(stall, woken).await {
                Ok(Ok(())) => {}
                Ok(Err(stop)) => return Err(stop),
                // The connection writes, only slowly: wait on.
                Err(_) if self.written.get() != written => {}
                Err(_) => return Err(Stop::Error(ProxyError::ClientTimeout)),
            }
        }
    }
}

/// A stream's place among the waiters: counted in `waiting` until a wake-up (which
/// clears the count) or until it leaves unwoken.
struct Seat<'o> {
    outbox: &'o Outbox,
    /// The wake-ups before it came.
    round: u64,
}

impl<'o> Seat<'o> {
    fn take(outbox: &'o Outbox) -> Seat<'o> {
        outbox.waiting.set(outbox.waiting.get() + 1);
        Seat {
            outbox,
            round: outbox.round.get(),
        }
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let o = self.outbox;
        if o.round.get() == self.round {
            o.waiting.set(o.waiting.get() - 1);
        }
    }
}

tokio::task_local! {
    /// The running stream task's connection and stream id (`conn::spawn_stream`): what
    /// `send` counts its hand-offs against, without threading the connection through
    /// every path that sends a body (an upstream's, a file's, a cache entry's, a
    /// WebSocket's, Weir's own answers).
    static STREAM: StreamOut;
}

/// A stream task's entry in its connection's [`Outbox`], from the task's start to its
/// end (dropped with the task).
pub struct StreamOut {
    shared: Rc<Shared>,
    id: u32,
}

impl StreamOut {
    /// Runs the stream task `task` of the stream `id` of the connection `shared`, its
    /// hand-offs counted.
    pub fn scope<F: Future>(
        shared: Rc<Shared>,
        id: u32,
        task: F,
    ) -> impl Future<Output = F::Output> {
        shared.outbox.open(id);
        STREAM.scope(StreamOut { shared, id }, task)
    }
}

impl Drop for StreamOut {
    fn drop(&mut self) {
        self.shared.outbox.close(self.id);
    }
}

/// The running stream handed `n` bytes to the `h2` crate.
#[inline]
pub fn handed(n: usize) {
    let _ = STREAM.try_with(|s| s.shared.outbox.handed(s.id, n));
}

/// How many of the `n` bytes the running stream (its half `send`) has window for may go
/// under the bound: all that fits, once at least `n` or [`MIN_PIECE`] does (waiting for
/// it as [`Outbox::room`] does).
#[inline]
pub async fn within(
    send: &mut SendStream<Bytes>,
    n: usize,
    stall: Duration,
) -> Result<usize, Stop> {
    let least = n.min(MIN_PIECE);
    // No bound outside a stream task. Once the client's RST_STREAM for the stream passed,
    // it hands nothing more: the `h2` crate may not have read that reset yet (it stops
    // decoding while a PING ACK waits for a socket the client does not read), and would
    // take and hold what the stream hands, uncounted: the review's way around the bound
    // (a PING, then a reset of every stream).
    let room = match STREAM
        .try_with(|s| s.shared.outbox.room_for(s.id, least))
        .unwrap_or(Some(usize::MAX))
    {
        _ if n == 0 => return Ok(0),
        None => return Err(Stop::Reset),
        Some(0) => match STREAM.try_with(|s| (s.shared.clone(), s.id)) {
            Ok((shared, id)) => shared.outbox.room(id, send, stall, least).await?,
            Err(_) => usize::MAX,
        },
        Some(room) => room,
    };
    Ok(n.min(room))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(o: &Outbox) -> Vec<(u32, usize)> {
        o.streams.borrow().iter().map(|h| (h.id, h.bytes)).collect()
    }

    #[test]
    fn a_streams_first_piece_goes_at_the_bound_and_a_reset_stream_hands_nothing() {
        let o = Outbox::new(2 * MIN_PIECE as u32);
        o.open(1);
        o.open(3);
        assert_eq!(o.room_for(1, 1), Some(2 * MIN_PIECE));
        o.handed(1, 2 * MIN_PIECE);
        assert_eq!(o.room_for(1, 1), Some(0), "started, at the bound: waits");
        assert_eq!(o.room_for(3, 1), Some(MIN_PIECE), "its first piece goes");
        o.handed(3, 100);
        assert_eq!(o.room_for(3, 1), Some(0));
        o.reset(3);
        assert_eq!(o.room_for(3, 1), None);
        // Past half the bound over it, a first piece waits like any other.
        o.open(5);
        o.handed(5, 10);
        o.open(7);
        assert_eq!(o.room_for(7, 1), Some(MIN_PIECE));
        o.handed(1, MIN_PIECE);
        assert_eq!(o.room_for(7, 1), Some(0));
    }

    #[test]
    fn counts_what_is_handed_until_it_is_written() {
        let o = Outbox::new(100);
        o.open(1);
        o.open(3);
        o.handed(1, 60);
        o.handed(3, 30);
        assert_eq!((o.held.get(), o.room_now(1)), (90, 10));
        o.wrote(1, 50);
        o.wrote(3, 30);
        assert_eq!((o.held.get(), o.room_now(1)), (10, 90));
        // Less room than a stream wants at least: it waits.
        assert_eq!((o.room_now(90), o.room_now(91)), (90, 0));
        // A stream whose task ended keeps its entry until its bytes are written.
        o.close(1);
        o.close(3);
        assert_eq!(entries(&o), [(1, 10)]);
        o.wrote(1, 10);
        assert_eq!((o.held.get(), entries(&o)), (0, vec![]));
        // Bytes of a stream with no entry (another task's, or written twice) are ignored.
        o.wrote(7, 5);
        assert_eq!(o.held.get(), 0);
    }

    #[test]
    fn a_reset_drops_what_the_stream_held_and_what_it_hands_after() {
        let o = Outbox::new(100);
        o.open(1);
        o.handed(1, 80);
        o.reset(1);
        assert_eq!(o.held.get(), 0);
        // The `h2` crate drops these too (it may read the RST_STREAM after they came).
        o.handed(1, 50);
        assert_eq!(o.held.get(), 0);
        o.close(1);
        assert!(entries(&o).is_empty());
        // A reset of a stream whose task ended and that still held bytes.
        o.open(3);
        o.handed(3, 40);
        o.close(3);
        o.reset(3);
        assert_eq!((o.held.get(), entries(&o)), (0, vec![]));
    }

    #[test]
    fn while_one_waits_newcomers_wait_until_half_is_written() {
        let o = Outbox::new(100);
        o.open(1);
        o.handed(1, 100);
        assert_eq!(o.room_now(1), 0);
        let seat = Seat::take(&o);
        o.wrote(1, 40);
        // Room, but the waiter goes first: no one passes it.
        assert_eq!(o.room_now(1), 0);
        o.wrote(1, 10);
        // Half written: the waiters are woken (and no longer counted), room for all.
        assert_eq!((o.waiting.get(), o.room_now(1)), (0, 50));
        drop(seat);
        assert_eq!(o.waiting.get(), 0);
        // A waiter that leaves unwoken is no longer counted.
        o.handed(1, 50);
        let seat = Seat::take(&o);
        drop(seat);
        assert_eq!(o.waiting.get(), 0);
    }
}
