//! A listener's `max_connections`, counted once for the listener across all workers.
//!
//! Each worker accepts on its own SO_REUSEPORT socket, and the kernel spreads connections
//! over those sockets by a hash of their addresses, not evenly: at 10,000 connections one
//! worker may get several hundred more than another. A cap shared out as a fixed share per
//! worker (`max_connections / workers`) therefore stopped one worker at its share while the
//! listener was well under its cap, and the connections queued on that worker's socket
//! waited seconds for a close (seed 002 at `ab -c 10000`). So the cap is one count per
//! listener: an atomic that a worker increments right before each `accept` (an accept is
//! rare next to the requests and bytes of a connection) and that a connection decrements
//! when it closes.
//!
//! A place is taken *after* the socket is readable and given back if `accept` finds
//! nothing, so no worker holds a place while it waits: the cap is exact, and a worker with
//! a connection waiting always gets the last free place. At the cap an HTTP listener
//! closes an idle connection for the newcomer (`reclaim`); when the newcomer's worker has
//! none it asks the others here ([`ConnectionCap::ask`]), the only cross-worker step, taken
//! at the cap only. Otherwise (TCP listeners, or nothing idle anywhere) the accept loops
//! pause (the kernel backlog holds new connections, counted in `weir_accept_paused_total`)
//! until a connection of the listener closes on any worker.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// The open connections of one listener (all workers, all socket generations).
#[derive(Debug, Default)]
pub struct ConnectionCap {
    open: AtomicUsize,
    /// The listener's `max_connections`: a reload changes it in place (no new sockets).
    limit: AtomicUsize,
    /// Accept loops paused at the cap: only then does a close need to wake anyone (a
    /// `Notify` takes a lock; most closes happen below the cap and skip it).
    waiting: AtomicUsize,
    closed: Notify,
    /// The accept loops (by id) holding a newcomer at the cap with no idle connection on
    /// their own worker, which asked the other workers to close one of theirs. At most one
    /// entry per accept loop; locked only at the cap.
    asks: Mutex<Vec<u64>>,
    /// Signalled when an ask is added.
    asked: Notify,
}

/// A listener's cap as one accept loop holds it: the open connections shared by every
/// worker, and the listener's `max_connections` (kept with them, so that a reload changes
/// it for every accept loop at once).
#[derive(Clone, Debug)]
pub struct ListenerCap {
    pub count: Arc<ConnectionCap>,
}

impl ListenerCap {
    /// The listener's `max_connections` now.
    pub fn limit(&self) -> usize {
        self.count.limit()
    }

    /// Takes a place for one connection if fewer than `limit` are open.
    pub fn try_acquire(&self) -> Option<Permit> {
        self.count.try_acquire(self.limit())
    }

    /// A place even at the cap: for a connection already accepted that must not be reset
    /// (the queue of a socket being closed, see `accept::drain_queue`). It counts like any.
    pub fn acquire_over(&self) -> Permit {
        self.count.open.fetch_add(1, SeqCst);
        Permit(self.count.clone())
    }

    /// Whether fewer than `limit` connections are open.
    pub fn is_below(&self) -> bool {
        self.count.open() < self.limit()
    }

    /// Waits until fewer than `limit` connections are open ([`ConnectionCap::wait_below`]).
    pub async fn wait_below(&self, paused: impl FnOnce()) {
        self.count.wait_below(paused).await
    }
}

impl ConnectionCap {
    /// A cap of `limit` connections, none open.
    pub fn new(limit: usize) -> ConnectionCap {
        let cap = ConnectionCap::default();
        cap.limit.store(limit, SeqCst);
        cap
    }

    /// The listener's `max_connections`.
    pub fn limit(&self) -> usize {
        self.limit.load(SeqCst)
    }

    /// Changes the limit (a reload); accept loops paused at the old one look again.
    pub fn set_limit(&self, limit: usize) {
        if self.limit.swap(limit, SeqCst) != limit {
            self.closed.notify_waiters();
        }
    }

    /// Takes a place for one connection if fewer than `limit` are open.
    pub fn try_acquire(self: &Arc<ConnectionCap>, limit: usize) -> Option<Permit> {
        self.open
            .fetch_update(SeqCst, SeqCst, |n| (n < limit).then_some(n + 1))
            .ok()?;
        Some(Permit(self.clone()))
    }

    /// Open connections (accepts in progress included).
    pub fn open(&self) -> usize {
        self.open.load(SeqCst)
    }

    /// Waits until fewer than `limit` connections are open (or the limit is raised above
    /// them). Returns at once if they are; `paused` is called once if it has to wait.
    pub async fn wait_below(&self, paused: impl FnOnce()) {
        if self.open() < self.limit() {
            return;
        }
        paused();
        let _waiting = Waiting::enter(&self.waiting);
        loop {
            // Registered before the check, so a close between the check and the wait is
            // not missed; and `waiting` was raised before the check, so that close notifies
            // (both sides use SeqCst: the closer's decrement and its read of `waiting` cannot
            // both miss the raise and the check).
            let closed = self.closed.notified();
            if self.open() < self.limit() {
                return;
            }
            closed.await;
        }
    }

    /// Asks the workers to close one idle connection of the listener for the accept loop
    /// `asker` (a no-op while its earlier ask is still open).
    pub fn ask(&self, asker: u64) {
        let mut asks = self.asks();
        if !asks.contains(&asker) {
            asks.push(asker);
        }
        drop(asks);
        self.asked.notify_waiters();
    }

    /// Takes back `asker`'s open ask (it got a place another way).
    pub fn withdraw(&self, asker: u64) {
        self.asks().retain(|&a| a != asker);
    }

    /// Takes the oldest open ask, for a worker about to close an idle connection; false if
    /// there is none (answered by another worker, or withdrawn).
    pub fn take_ask(&self) -> bool {
        let mut asks = self.asks();
        !asks.is_empty() && {
            asks.remove(0);
            true
        }
    }

    /// Resolves once an ask is open (at once if one is).
    pub async fn asked(&self) {
        loop {
            // Registered before the check: an ask made in between wakes it.
            let asked = self.asked.notified();
            tokio::pin!(asked);
            asked.as_mut().enable();
            if !self.asks().is_empty() {
                return;
            }
            asked.await;
        }
    }

    fn asks(&self) -> MutexGuard<'_, Vec<u64>> {
        self.asks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn release(&self) {
        self.open.fetch_sub(1, SeqCst);
        if self.waiting.load(SeqCst) > 0 {
            self.closed.notify_waiters();
        }
    }
}

/// One place under a listener's cap, held by an accepted connection until it closes.
#[derive(Debug)]
pub struct Permit(Arc<ConnectionCap>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Counts a paused accept loop for as long as it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn places_are_counted_once_for_the_listener() {
        let cap = Arc::new(ConnectionCap::default());
        let a = cap.try_acquire(2).unwrap();
        let _b = cap.try_acquire(2).unwrap();
        assert!(cap.try_acquire(2).is_none(), "at the cap");
        drop(a);
        assert_eq!(cap.open(), 1);
        assert!(cap.try_acquire(2).is_some(), "a close frees a place");
    }

    #[tokio::test]
    async fn an_ask_is_answered_once_and_can_be_withdrawn() {
        let cap = Arc::new(ConnectionCap::default());
        assert!(!cap.take_ask());
        cap.ask(1);
        cap.ask(1);
        cap.ask(2);
        // Bounded only to turn a lost ask into a failure instead of a hang.
        tokio::time::timeout(Duration::from_secs(30), cap.asked())
            .await
            .expect("an ask is open");
        cap.withdraw(2);
        assert!(cap.take_ask(), "asker 1, once");
        assert!(!cap.take_ask());
        let waiting = cap.clone();
        let answered = tokio::spawn(async move { waiting.asked().await });
        tokio::task::yield_now().await;
        cap.ask(3);
        tokio::time::timeout(Duration::from_secs(30), answered)
            .await
            .expect("woken by the ask")
            .unwrap();
    }

    #[tokio::test]
    async fn a_raised_limit_wakes_a_paused_waiter() {
        let cap = Arc::new(ConnectionCap::new(1));
        let _held = cap.try_acquire(1).unwrap();
        let waiter = {
            let cap = cap.clone();
            tokio::spawn(async move { cap.wait_below(|| {}).await })
        };
        while cap.waiting.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        cap.set_limit(2);
        // Bounded only to turn a lost wake-up into a failure instead of a hang.
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("woken by the new limit")
            .unwrap();
    }

    #[tokio::test]
    async fn a_paused_waiter_wakes_when_a_connection_closes_on_another_thread() {
        let cap = Arc::new(ConnectionCap::new(1));
        let held = cap.try_acquire(1).unwrap();
        let mut paused = false;
        let watched = cap.clone();
        // Closes once the waiter has paused (polls for it).
        let closer = std::thread::spawn(move || {
            while watched.waiting.load(SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(held);
        });
        let wait = cap.wait_below(|| paused = true);
        // Bounded only to turn a lost wake-up into a failure instead of a hang.
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("woken by the close");
        assert!(paused);
        closer.join().unwrap();
        assert_eq!(cap.waiting.load(SeqCst), 0);
    }
}
