//! One worker's places for the connections that may be closed to make room for a new
//! one, per listener (metric slot), each set an [`EvictionTable`] (idlest first, O(1)):
//!
//! - `Worker::handshakes`: TLS handshakes in progress, under the listener's
//!   `max_handshakes` (at that cap the idlest gives its place to the newcomer,
//!   `tls::handshake`; QUIC ones too, `http3::conn`); a handshake enters once ([`Place`]);
//! - `Worker::idle`: every HTTP connection, with a seat for its whole life
//!   ([`IdlePlace`]) that is evictable only while the connection waits for a request: an
//!   HTTP/1 connection for the first byte of its first or next request (`client`), an
//!   HTTP/2 one while it has no stream (`http2::conn`). There is no cap of idle
//!   connections; the listener's `max_connections` takes them back for newcomers
//!   (`listener::reclaim`), together with the handshakes. A TCP connection takes a
//!   [`Place`] here until its relay starts (`tcp::serve_tcp`).
//!
//! A place holds the waker of its connection's task, woken when the place is taken, and
//! the time of the connection's last step forward (entering, going idle, or
//! [`Place::progressed`]), so the reclaimer can pick the idlest of both sets. Every
//! operation is a thread-local slab operation (no lock, no atomic: thread per core).
//! Going idle and busy again, once per keep-alive request, only links and unlinks the
//! connection's seat: its waker was cloned once, when the connection first waited.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::evict::{EvictionTable, Key};

/// One worker's places of one kind, by listener metric slot.
#[derive(Debug, Default)]
pub struct Places {
    slots: RefCell<Vec<SlotPlaces>>,
    /// Places taken so far: a watcher that looked after the last taking need not look
    /// again (`IdlePlace::poll_taken`).
    takings: Cell<u64>,
}

#[derive(Debug, Default)]
struct SlotPlaces {
    /// The seats; only the evictable ones are in its line (handshakes, idle connections).
    table: EvictionTable<Seat>,
    /// A task waiting for this listener to have an evictable place here
    /// (`Places::poll_occupied`).
    watcher: Option<Waker>,
}

impl SlotPlaces {
    /// A place became evictable: the watcher learns of it.
    fn tell_watcher(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.wake();
        }
    }
}

#[derive(Debug)]
struct Seat {
    /// The connection's task, woken when the place is taken.
    waker: Option<Waker>,
    /// The connection's last step forward.
    since: Instant,
}

impl Seat {
    fn wake(self) {
        if let Some(waker) = self.waker {
            waker.wake();
        }
    }

    /// Keeps `cx`'s waker (cloned only when it is another task's).
    fn watch(&mut self, cx: &Context<'_>) {
        match &mut self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
    }
}

impl Places {
    /// The places of the listener with slot `slot` (made on first use).
    fn slot(&self, slot: usize) -> std::cell::RefMut<'_, SlotPlaces> {
        std::cell::RefMut::map(self.slots.borrow_mut(), |slots| {
            if slots.len() <= slot {
                slots.resize_with(slot + 1, SlotPlaces::default);
            }
            &mut slots[slot]
        })
    }

    /// Takes an evictable place for a connection of the listener with slot `slot` whose
    /// last step was at `since`; at `max` places the idlest gives up its place (its task
    /// is woken).
    pub fn enter(&self, slot: usize, max: usize, since: Instant) -> Place<'_> {
        let mut places = self.slot(slot);
        places.tell_watcher();
        let seat = Seat { waker: None, since };
        // Woken, not polled, here: each evicted task runs later and closes itself.
        let taken = |seat: Seat| {
            self.takings.set(self.takings.get() + 1);
            seat.wake();
        };
        let key = match places.table.admit(max, seat, taken) {
            crate::evict::Admitted::Free(key) | crate::evict::Admitted::Evicted(key) => key,
            // Nothing is ever held here, so a full table always has one to evict.
            crate::evict::Admitted::Full => places.table.insert(Seat { waker: None, since }),
        };
        Place {
            places: self,
            slot,
            key,
        }
    }

    /// Ready once `key`'s place was taken; else the task is woken when it is.
    fn poll_taken(&self, slot: usize, key: Key, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.slots.borrow_mut();
        match slots.get_mut(slot).and_then(|s| s.table.get_mut(key)) {
            Some(seat) => {
                seat.watch(cx);
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }

    /// Gives `key`'s place back (no-op if it was taken).
    fn leave(&self, slot: usize, key: Key) {
        let seat = self
            .slots
            .borrow_mut()
            .get_mut(slot)
            .and_then(|s| s.table.remove(key));
        // Dropped outside the borrow: a waker's drop runs foreign code.
        drop(seat);
    }

    /// The places taken for connections of the listener with slot `slot`.
    pub fn occupied(&self, slot: usize) -> usize {
        self.slots.borrow().get(slot).map_or(0, |s| s.table.len())
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
        let Some(seat) = seat else {
            return false;
        };
        self.takings.set(self.takings.get() + 1);
        seat.wake();
        true
    }

    /// Ready if the listener has an evictable place here; else `cx` is woken when one
    /// becomes evictable.
    pub fn poll_occupied(&self, slot: usize, cx: &mut Context<'_>) -> Poll<()> {
        let mut places = self.slot(slot);
        if places.table.oldest().is_some() {
            return Poll::Ready(());
        }
        match &places.watcher {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => places.watcher = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Wakes the task of every evictable place, keeping the places (the worker drains:
    /// each looks at why itself).
    pub fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .slots
            .borrow()
            .iter()
            .flat_map(|s| s.table.evictable())
            .filter_map(|seat| seat.waker.clone())
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// A connection's evictable place (a TLS handshake's), given back when dropped.
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
        if let Some(seat) = slots
            .get_mut(self.slot)
            .and_then(|s| s.table.progressed(self.key))
        {
            seat.since = Instant::now();
        }
    }

    /// Resolves once a newcomer took this place.
    pub fn taken(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| self.places.poll_taken(self.slot, self.key, cx))
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.places.leave(self.slot, self.key);
    }
}

/// A connection's seat among its worker's idle connections, held for its whole life and
/// evictable only while it rests ([`rest`](Self::rest) .. [`busy`](Self::busy)): an HTTP/1
/// connection between requests, an HTTP/2 one while no stream runs (its streams' tasks
/// make it rest and busy, its own task watches it). Resting and getting busy link and
/// unlink the seat; the waker is cloned when the seat is first watched, and again only if
/// another task watches. The owner calls [`close`](Self::close) when the connection ends
/// (`Default`: no seat, as after `close`).
#[derive(Debug)]
pub struct IdlePlace {
    /// The listener's metric slot and the seat's key (stale once the place was taken).
    seat: Cell<Option<(usize, Key)>>,
    state: Cell<Rest>,
    /// `Places::takings` when the place was last seen untaken, its seat holding the
    /// watching task's waker (`NOT_LOOKED`: not since it was made, or it was taken).
    looked: Cell<u64>,
}

impl Default for IdlePlace {
    fn default() -> IdlePlace {
        IdlePlace {
            seat: Cell::new(None),
            state: Cell::new(Rest::Closed),
            looked: Cell::new(NOT_LOOKED),
        }
    }
}

/// `IdlePlace::looked` before a look, and after a taking: never a count of takings.
const NOT_LOOKED: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rest {
    /// Not evictable: working, or not yet waiting.
    Busy,
    /// Waiting for a request: a newcomer at the cap may take the place.
    Resting,
    /// A newcomer took the place.
    Taken,
    /// No seat (closed, or handed to another owner).
    Closed,
}

impl IdlePlace {
    /// A busy seat for a new connection of the listener with slot `slot`, accepted at
    /// `since`.
    pub fn new(places: &Places, slot: usize, since: Instant) -> IdlePlace {
        let mut slot_places = places.slot(slot);
        let key = slot_places.table.insert(Seat { waker: None, since });
        slot_places.table.hold(key);
        IdlePlace {
            seat: Cell::new(Some((slot, key))),
            state: Cell::new(Rest::Busy),
            looked: Cell::new(NOT_LOOKED),
        }
    }

    /// The connection waits for a request, idle since `since`: a newcomer may take its
    /// place from now on (no-op unless busy).
    pub fn rest(&self, places: &Places, since: Instant) {
        if self.state.get() == Rest::Busy {
            self.rest_in(&mut places.slots.borrow_mut(), since);
        }
    }

    fn rest_in<'s>(&self, slots: &'s mut [SlotPlaces], since: Instant) -> Option<&'s mut Seat> {
        let (slot, key) = self.seat.get()?;
        let places = slots.get_mut(slot)?;
        places.tell_watcher();
        match places.table.progressed(key) {
            Some(seat) => {
                seat.since = since;
                self.state.set(Rest::Resting);
                Some(seat)
            }
            None => {
                self.taken();
                None
            }
        }
    }

    /// [`rest`](Self::rest), then [`poll_taken`](Self::poll_taken), in one look at the
    /// table (an HTTP/1 connection's wait for its next request).
    pub fn poll_rest(&self, places: &Places, since: Instant, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.get() == Rest::Busy {
            let mut slots = places.slots.borrow_mut();
            if let Some(seat) = self.rest_in(&mut slots, since) {
                // Watched already: the seat has this task's waker (one task watches).
                if self.looked.get() == NOT_LOOKED {
                    seat.watch(cx);
                }
                self.looked.set(places.takings.get());
                return Poll::Pending;
            }
        }
        self.poll_taken(places, cx)
    }

    /// Ready once a newcomer took the place (it stays taken); else the watching task is
    /// woken when it is. Once watched, the seat keeps the waker (one task watches, an
    /// HTTP/2 connection's each time it turns), and the table is looked at again only
    /// after a taking on this worker (rare: at the cap).
    #[inline]
    pub fn poll_taken(&self, places: &Places, cx: &mut Context<'_>) -> Poll<()> {
        if self.looked.get() == places.takings.get() {
            return Poll::Pending;
        }
        self.look(places, cx)
    }

    /// [`poll_taken`](Self::poll_taken) in the table.
    #[inline(never)]
    fn look(&self, places: &Places, cx: &mut Context<'_>) -> Poll<()> {
        let (Rest::Busy | Rest::Resting, Some((slot, key))) = (self.state.get(), self.seat.get())
        else {
            return match self.state.get() {
                Rest::Taken => Poll::Ready(()),
                _ => Poll::Pending,
            };
        };
        if places.poll_taken(slot, key, cx).is_ready() {
            self.taken();
            return Poll::Ready(());
        }
        self.looked.set(places.takings.get());
        Poll::Pending
    }

    fn taken(&self) {
        self.state.set(Rest::Taken);
        self.looked.set(NOT_LOOKED);
    }

    /// The connection works again (bytes came, a stream started): its place is no
    /// newcomer's to take. False if a newcomer had taken it.
    pub fn busy(&self, places: &Places) -> bool {
        match self.state.get() {
            Rest::Resting => {}
            Rest::Taken => return false,
            Rest::Busy | Rest::Closed => return true,
        }
        let kept = self.seat.get().is_some_and(|(slot, key)| {
            let mut slots = places.slots.borrow_mut();
            slots.get_mut(slot).is_some_and(|s| s.table.hold(key))
        });
        if kept {
            self.state.set(Rest::Busy);
        } else {
            self.taken();
        }
        kept
    }

    /// Gives the seat back for good (the connection ends); resting is a no-op after this.
    pub fn close(&self, places: &Places) {
        if let Some((slot, key)) = self.seat.take() {
            places.leave(slot, key);
        }
        self.state.set(Rest::Closed);
        self.looked.set(NOT_LOOKED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;
    use std::pin::pin;
    use std::time::Duration;

    impl Places {
        /// Evictable places of the listener with slot `slot`.
        fn evictable(&self, slot: usize) -> usize {
            let slots = self.slots.borrow();
            slots.get(slot).map_or(0, |s| s.table.evictable().count())
        }
    }

    impl Place<'_> {
        fn is_taken(&self) -> bool {
            let slots = self.places.slots.borrow();
            !slots
                .get(self.slot)
                .is_some_and(|s| s.table.contains(self.key))
        }
    }

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
            assert_eq!(places.evictable(0), 2);
            // Other listeners have their own places.
            let _other = places.enter(1, 1, now);
            assert_eq!(places.evictable(1), 1);
        }
        // `_third` is gone; `second`, evicted, gives nothing back when dropped.
        drop(second);
        assert_eq!(
            places.evictable(0),
            1,
            "an evicted place is not given back twice"
        );
    }

    #[test]
    fn only_resting_seats_are_taken_the_idlest_first_and_a_watcher_learns_of_them() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        assert!(places.poll_occupied(3, &mut cx).is_pending());
        assert!(!places.evict_oldest(3));
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let (a, b) = (
            IdlePlace::new(&places, 3, t0),
            IdlePlace::new(&places, 3, t0),
        );
        assert!(places.poll_occupied(3, &mut cx).is_pending(), "busy seats");
        assert!(a.poll_rest(&places, t0, &mut cx).is_pending());
        assert_eq!(count.woken(), 1, "the watcher is told");
        assert!(b.poll_rest(&places, t1, &mut cx).is_pending());
        assert!(places.poll_occupied(3, &mut cx).is_ready());
        assert_eq!(places.oldest(3), Some(t0));
        assert!(places.evict_oldest(3));
        assert_eq!(count.woken(), 2, "the evicted task is woken");
        assert!(a.poll_taken(&places, &mut cx).is_ready());
        assert!(!a.busy(&places), "taken");
        assert!(a.poll_taken(&places, &mut cx).is_ready(), "it stays taken");
        assert_eq!(places.oldest(3), Some(t1));
        // Busy again: not evictable, and it keeps its seat.
        assert!(b.busy(&places));
        assert_eq!(places.oldest(3), None);
        assert!(!places.evict_oldest(3));
        b.rest(&places, t1);
        assert!(places.evict_oldest(3));
        assert!(!b.busy(&places));
        a.close(&places);
        b.close(&places);
    }

    #[test]
    fn an_idle_place_is_watched_with_one_waker_clone_and_its_close_is_final() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let place = IdlePlace::new(&places, 0, Instant::now());
        // An HTTP/2 connection: its task watches, its stream tasks rest and busy it.
        assert!(place.poll_taken(&places, &mut cx).is_pending());
        for _ in 0..3 {
            place.rest(&places, Instant::now());
            place.rest(&places, Instant::now());
            assert_eq!(places.evictable(0), 1, "rests once");
            assert!(place.busy(&places), "kept");
            assert!(place.poll_taken(&places, &mut cx).is_pending());
        }
        assert_eq!(places.evictable(0), 0);
        // The waker stayed in the seat: a taking of the resting place wakes the watcher.
        place.rest(&places, Instant::now());
        assert!(places.evict_oldest(0));
        assert_eq!(count.woken(), 1);
        assert!(place.poll_taken(&places, &mut cx).is_ready());
        assert!(!place.busy(&places), "it had been taken");
        place.close(&places);
        place.rest(&places, Instant::now());
        assert_eq!(places.evictable(0), 0, "closed: no place again");
        assert!(place.poll_taken(&places, &mut cx).is_pending());
        // A closed seat is removed from the table, a handed-over one is no seat at all.
        let kept = IdlePlace::new(&places, 0, Instant::now());
        let handed = std::mem::take(&mut IdlePlace::new(&places, 0, Instant::now()));
        kept.close(&places);
        handed.close(&places);
        assert!(places.slots.borrow()[0].table.is_empty());
    }

    #[test]
    fn wake_all_wakes_every_resting_place_and_keeps_the_places_in_order() {
        let places = Places::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let t0 = Instant::now();
        let a = IdlePlace::new(&places, 0, t0);
        let b = IdlePlace::new(&places, 0, t0);
        let busy = IdlePlace::new(&places, 0, t0);
        assert!(a.poll_rest(&places, t0, &mut cx).is_pending());
        assert!(b
            .poll_rest(&places, t0 + Duration::from_secs(1), &mut cx)
            .is_pending());
        assert!(busy.poll_taken(&places, &mut cx).is_pending());
        places.wake_all();
        assert_eq!(count.woken(), 2, "the resting ones");
        assert_eq!(places.oldest(0), Some(t0));
        assert!(a.busy(&places) && b.busy(&places));
        assert_eq!(places.oldest(0), None);
    }
}
