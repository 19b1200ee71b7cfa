//! The TLS handshakes in progress on one worker, per listener, held against the
//! listener's `max_handshakes`. At the cap a new connection is not turned away: the
//! handshake that has gone longest without a step forward (its accept, or its whole
//! ClientHello) gives up its place (`crate::evict` says why that order), its task wakes
//! and closes the connection, counted as `reason="evicted"` in
//! `weir_tls_handshake_failures_total`.
//!
//! Worker-local (thread per core): a `RefCell` per worker, no lock. HTTP listeners and
//! TCP listeners with TLS offload share it through `tls::handshake`.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::task::{Poll, Waker};

use crate::evict::{EvictionTable, Key};

/// One worker's handshakes in progress, by listener metric slot.
#[derive(Debug, Default)]
pub struct Handshakes {
    /// Each entry holds the waker of its task's [`Pending::evicted`].
    tables: RefCell<Vec<EvictionTable<Option<Waker>>>>,
}

impl Handshakes {
    /// Enters a handshake of the listener with metric slot `slot`, at most `max` at once
    /// on this worker: at the cap the idlest one is evicted to make room.
    pub fn enter(&self, slot: usize, max: usize) -> Pending<'_> {
        let mut tables = self.tables.borrow_mut();
        if tables.len() <= slot {
            tables.resize_with(slot + 1, EvictionTable::default);
        }
        // Woken, not polled, here: each evicted task runs later and counts itself.
        let admitted =
            tables[slot].admit(max, None, |waker| waker.into_iter().for_each(Waker::wake));
        let key = match admitted {
            crate::evict::Admitted::Free(key) | crate::evict::Admitted::Evicted(key) => key,
            // Nothing is ever held here, so a full table always has one to evict.
            crate::evict::Admitted::Full => tables[slot].insert(None),
        };
        Pending {
            handshakes: self,
            slot,
            key,
        }
    }

    /// Handshakes in progress of the listener with metric slot `slot`.
    pub fn in_progress(&self, slot: usize) -> usize {
        self.tables.borrow().get(slot).map_or(0, EvictionTable::len)
    }
}

/// A handshake's place, given back when dropped.
#[derive(Debug)]
pub struct Pending<'a> {
    handshakes: &'a Handshakes,
    slot: usize,
    key: Key,
}

impl Pending<'_> {
    /// The handshake made a step (its ClientHello is whole): it is the freshest again.
    pub fn progressed(&self) {
        if let Some(table) = self.handshakes.tables.borrow_mut().get_mut(self.slot) {
            table.progressed(self.key);
        }
    }

    /// Resolves once a newcomer took this handshake's place.
    pub fn evicted(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            let mut tables = self.handshakes.tables.borrow_mut();
            match tables.get_mut(self.slot).and_then(|t| t.get_mut(self.key)) {
                None => Poll::Ready(()),
                Some(Some(waker)) if waker.will_wake(cx.waker()) => Poll::Pending,
                Some(waker) => {
                    *waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(table) = self.handshakes.tables.borrow_mut().get_mut(self.slot) {
            table.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::CountingWaker;
    use std::pin::pin;
    use std::task::Context;

    #[test]
    fn a_newcomer_at_the_cap_evicts_the_idlest_and_wakes_it() {
        let handshakes = Handshakes::default();
        let (count, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        let first = handshakes.enter(0, 2);
        let second = handshakes.enter(0, 2);
        // The first one's ClientHello came: the second is now the idlest.
        first.progressed();
        let mut first_evicted = pin!(first.evicted());
        assert!(first_evicted.as_mut().poll(&mut cx).is_pending());
        {
            let mut second_evicted = pin!(second.evicted());
            assert!(second_evicted.as_mut().poll(&mut cx).is_pending());
            let _third = handshakes.enter(0, 2);
            assert_eq!(count.woken(), 1, "the evicted task is woken");
            assert!(second_evicted.as_mut().poll(&mut cx).is_ready());
            assert!(first_evicted.as_mut().poll(&mut cx).is_pending());
            assert_eq!(handshakes.in_progress(0), 2);
            // Other listeners have their own places.
            let _other = handshakes.enter(1, 1);
            assert_eq!(handshakes.in_progress(1), 1);
        }
        // `_third` is gone; `second`, evicted, gives nothing back when dropped.
        drop(second);
        assert_eq!(
            handshakes.in_progress(0),
            1,
            "an evicted place is not given back twice"
        );
    }
}
