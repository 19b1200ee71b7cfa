//! One worker's places for the connections that may be closed to make room for a new
//! one, per listener (metric slot), each set an [`EvictionTable`] (idlest first, O(1)):
//!
//! - `Worker::handshakes`: TLS handshakes in progress, under the listener's
//!   `max_handshakes` (at that cap the idlest gives its place to the newcomer,
//!   `tls::handshake`);
//! - `Worker::idle`: connections waiting for a request, an HTTP/1 connection for the first
//!   byte of its first or next request (`client`), an HTTP/2 one while it has no stream
//!   (`http2::conn`). They hold no place of their own kind (no cap of idle connections);
//!   the listener's `max_connections` takes them back for newcomers
//!   (`listener::reclaim`), together with the handshakes.
//!
//! A place holds the waker of its connection's task, woken when the place is taken, and
//! the time of the connection's last step forward (entering, or
//! [`Place::progressed`]), so the reclaimer can pick the idlest of both sets. Entering
//! and leaving is a thread-local slab operation (no lock, no atomic: thread per core); an
//! idle HTTP/1 connection enters once per keep-alive wait.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::evict::{EvictionTable, Key};

/// One worker's places of one kind, by listener metric slot.
#[derive(Debug, Default)]
pub struct Places {
    slots: RefCell<Vec<SlotPlaces>>,
}

#[derive(Debug, Default)]
struct SlotPlaces {
    table: EvictionTable<Seat>,
    /// A task waiting for this listener to have a place here (`Places::poll_occupied`).
    watcher: Option<Waker>,
}

#[derive(Debug)]
struct Seat {
    /// The connection's task, woken when the place is taken.
    waker: Option<Waker>,
    /// The connection's last step forward.
    since: Instant,
}

impl Places {
    /// Takes a place for a connection of the listener with slot `slot` whose last step was
    /// at `since`; at `max` places the idlest gives up its place (its task is woken).
    pub fn enter(&self, slot: usize, max: usize, since: Instant) -> Place<'_> {
        Place {
            places: self,
            slot,
            key: self.take(slot, max, since, None),
        }
    }

    /// [`enter`](Self::enter) for an owner that keeps the key itself (an HTTP/2 connection,
    /// whose streams enter and leave): `waker` is its task's.
    pub fn take(&self, slot: usize, max: usize, since: Instant, waker: Option<Waker>) -> Key {
        let mut slots = self.slots.borrow_mut();
        if slots.len() <= slot {
            slots.resize_with(slot + 1, SlotPlaces::default);
        }
        let places = &mut slots[slot];
        if let Some(watcher) = places.watcher.take() {
            watcher.wake();
        }
        let seat = Seat { waker, since };
        // Woken, not polled, here: each evicted task runs later and closes itself.
        match places.table.admit(max, seat, Seat::wake) {
            crate::evict::Admitted::Free(key) | crate::evict::Admitted::Evicted(key) => key,
            // Nothing is ever held here, so a full table always has one to evict.
            crate::evict::Admitted::Full => places.table.insert(Seat { waker: None, since }),
        }
    }

    /// Gives `key`'s place back: its task's waker, or `None` if the place was taken.
    pub fn leave(&self, slot: usize, key: Key) -> Option<Option<Waker>> {
        let mut slots = self.slots.borrow_mut();
        let seat = slots.get_mut(slot)?.table.remove(key)?;
        Some(seat.waker)
    }

    /// Ready once `key`'s place was taken; else the task is woken when it is.
    pub fn poll_taken(&self, slot: usize, key: Key, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.slots.borrow_mut();
        let Some(seat) = slots.get_mut(slot).and_then(|s| s.table.get_mut(key)) else {
            return Poll::Ready(());
        };
        match &mut seat.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The last step of the idlest connection of the listener with slot `slot`.
    pub fn oldest(&self, slot: usize) -> Option<Instant> {
        let slots = self.slots.borrow();
        Some(slots.get(slot)?.table.oldest()?.since)
    }

    /// Takes the place of the idlest connection of the listener (its task is woken and
    /// closes it); false if there is none.
    pub fn evict_oldest(&self, slot: usize) -> bool {
        let seat = self
            .slots
            .borrow_mut()
            .get_mut(slot)
            .and_then(|s| s.table.evict());
        seat.map(Seat::wake).is_some()
    }

    /// Places of the listener with metric slot `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.slots.borrow().get(slot).map_or(0, |s| s.table.len())
    }

    /// Ready if the listener has a place here; else `cx` is woken when one is taken.
    pub fn poll_occupied(&self, slot: usize, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.slots.borrow_mut();
        if slots.len() <= slot {
            slots.resize_with(slot + 1, SlotPlaces::default);
        }
        let places = &mut slots[slot];
        if !places.table.is_empty() {
            return Poll::Ready(());
        }
        match &places.watcher {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => places.watcher = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Wakes every task holding a place, keeping the places (the worker drains: each
    /// looks at why itself).
    pub fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .slots
            .borrow_mut()
            .iter_mut()
            .flat_map(|s| s.table.values_mut())
            .filter_map(|seat| seat.waker.take())
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Seat {
    fn wake(self) {
        if let Some(waker) = self.waker {
            waker.wake();
        }
    }
}

/// A connection's place, given back when dropped.
#[derive(Debug)]
pub struct Place<'a> {
    places: &'a Places,
    slot: usize,
    key: Key,
}

impl Place<'_> {
    /// The connection made a step (a TLS handshake's whole ClientHello): it is the
    /// freshest again.
    pub fn progressed(&self) {
        let mut slots = self.places.slots.borrow_mut();
        if let Some(table) = slots.get_mut(self.slot).map(|s| &mut s.table) {
            if let Some(seat) = table.get_mut(self.key) {
                seat.since = Instant::now();
            }
            table.progressed(self.key);
        }
    }

    /// Resolves once a newcomer took this place.
    pub fn taken(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| self.poll_taken(cx))
    }

    pub fn poll_taken(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.places.poll_taken(self.slot, self.key, cx)
    }

    /// Whether a newcomer took this place.
    pub fn is_taken(&self) -> bool {
        let slots = self.places.slots.borrow();
        !slots
            .get(self.slot)
            .is_some_and(|s| s.table.contains(self.key))
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.places.leave(self.slot, self.key);
    }
}

/// A place that is entered and left again and again, from several tasks (an HTTP/2
/// connection: it is idle whenever its last stream ends, busy when one starts), watched
/// by one task (the connection's), which a taking wakes ([`poll_taken`](Self::poll_taken)). The
/// watcher's waker moves into the place and back out: entering and leaving clone no waker.
pub struct SharedPlace {
    slot: usize,
    key: Cell<Option<Key>>,
    /// The watcher's waker while no place is held.
    waker: Cell<Option<Waker>>,
    /// Closed for good: entering is a no-op.
    closed: Cell<bool>,
}

impl SharedPlace {
    /// No place yet, for a connection of the listener with metric slot `slot`.
    pub fn new(slot: usize) -> SharedPlace {
        SharedPlace {
            slot,
            key: Cell::new(None),
            waker: Cell::new(None),
            closed: Cell::new(false),
        }
    }

    /// Takes a place in `places` (idle since `since`), unless one is held already.
    pub fn enter(&self, places: &Places, since: Instant) {
        if self.key.get().is_none() && !self.closed.get() {
            let key = places.take(self.slot, usize::MAX, since, self.waker.take());
            self.key.set(Some(key));
        }
    }

    /// Gives the place back; false if a newcomer had taken it.
    pub fn leave(&self, places: &Places) -> bool {
        let Some(key) = self.key.take() else {
            return true;
        };
        match places.leave(self.slot, key) {
            Some(waker) => {
                self.waker.set(waker);
                true
            }
            None => false,
        }
    }

    /// Gives the place back and never takes one again (the connection is closing).
    pub fn close(&self, places: &Places) {
        self.closed.set(true);
        self.leave(places);
    }

    /// Ready once a newcomer took the place (it stays taken until [`leave`](Self::leave)).
    pub fn poll_taken(&self, places: &Places, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(key) = self.key.get() {
            return places.poll_taken(self.slot, key, cx);
        }
        // Kept as it is once known: one task watches, and its waker stays the same (this
        // runs each time the connection's task turns, once per frame it reads).
        let waker = self.waker.take();
        self.waker.set(waker.or_else(|| Some(cx.waker().clone())));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;
    use std::pin::pin;

    #[test]
    fn a_newcomer_at_the_cap_takes_the_idlest_place_and_wakes_it() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let now = Instant::now();
        let first = places.enter(0, 2, now);
        let second = places.enter(0, 2, now);
        // The first one's ClientHello came: the second is now the idlest.
        first.progressed();
        let mut first_taken = pin!(first.taken());
        assert!(first_taken.as_mut().poll(&mut cx).is_pending());
        {
            let mut second_taken = pin!(second.taken());
            assert!(second_taken.as_mut().poll(&mut cx).is_pending());
            let _third = places.enter(0, 2, now);
            assert_eq!(count.woken(), 1, "the evicted task is woken");
            assert!(second_taken.as_mut().poll(&mut cx).is_ready());
            assert!(second.is_taken() && !first.is_taken());
            assert!(first_taken.as_mut().poll(&mut cx).is_pending());
            assert_eq!(places.len(0), 2);
            // Other listeners have their own places.
            let _other = places.enter(1, 1, now);
            assert_eq!(places.len(1), 1);
        }
        // `_third` is gone; `second`, evicted, gives nothing back when dropped.
        drop(second);
        assert_eq!(places.len(0), 1, "an evicted place is not given back twice");
    }

    #[test]
    fn the_oldest_step_is_evicted_first_and_a_watcher_learns_of_a_new_place() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        assert!(places.poll_occupied(3, &mut cx).is_pending());
        assert!(!places.evict_oldest(3));
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(1);
        let a = places.take(3, usize::MAX, t0, Some(waker.clone()));
        assert_eq!(count.woken(), 1, "the watcher is told");
        let b = places.enter(3, usize::MAX, t1);
        assert!(places.poll_occupied(3, &mut cx).is_ready());
        assert_eq!(places.oldest(3), Some(t0));
        assert!(places.evict_oldest(3));
        assert_eq!(count.woken(), 2, "the evicted task is woken");
        assert!(places.leave(3, a).is_none(), "taken");
        assert_eq!(places.oldest(3), Some(t1));
        assert!(!b.is_taken());
    }

    #[test]
    fn a_shared_place_moves_its_watchers_waker_and_reports_a_taking() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let place = SharedPlace::new(0);
        let now = Instant::now();
        assert!(place.poll_taken(&places, &mut cx).is_pending());
        place.enter(&places, now);
        place.enter(&places, now);
        assert_eq!(places.len(0), 1, "entered once");
        assert!(place.poll_taken(&places, &mut cx).is_pending());
        assert!(place.leave(&places), "left untaken");
        place.enter(&places, now);
        // The waker moved in with the place: an eviction wakes the watcher.
        assert!(places.evict_oldest(0));
        assert_eq!(count.woken(), 1);
        assert!(place.poll_taken(&places, &mut cx).is_ready());
        assert!(!place.leave(&places), "it had been taken");
        place.close(&places);
        place.enter(&places, now);
        assert_eq!(places.len(0), 0, "closed: no place again");
    }

    #[test]
    fn wake_all_wakes_every_holder_and_keeps_the_places_in_order() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let t0 = Instant::now();
        let a = places.enter(0, usize::MAX, t0);
        let b = places.enter(0, usize::MAX, t0 + std::time::Duration::from_secs(1));
        assert!(a.poll_taken(&mut cx).is_pending());
        assert!(b.poll_taken(&mut cx).is_pending());
        places.wake_all();
        assert_eq!(count.woken(), 2);
        assert!(!a.is_taken() && !b.is_taken());
        assert_eq!(places.oldest(0), Some(t0));
    }
}
