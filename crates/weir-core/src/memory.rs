//! Giving memory back after a burst: free lists that shed what no one used for a while,
//! and the allocator's release of freed pages, both driven by a worker's trim tick.
//!
//! A worker reuses what its connections and streams hand back (a zeroed 16 KiB buffer, a
//! pipe2 call, a stream's head scratch saved each time), up to a cap per list. After a
//! burst, say an attack of thousands of stalled HTTP/2 streams, the lists would hold their
//! cap for good: tens of MiB nobody needs. So each [`Spares`] list remembers the fewest
//! items it held since it was last trimmed (items nobody took in that time) and
//! [`Spares::trim`] drops that many. A worker trims its lists every [`TRIM_INTERVAL`]:
//! a burst's leftovers go within two intervals of its end, while a steady load keeps what
//! it uses (the lists only lose what sat unused for a whole interval).
//!
//! Freed memory goes back to the allocator, which may keep the pages for reuse; an idle
//! thread never gets to hand them to the system. After each trim the worker calls the
//! release function the binary registered ([`set_release`]: mimalloc's `mi_collect`,
//! which frees the thread's empty pages and purges those freed a while ago). Library users
//! and tests without one lose nothing but that.

use std::cell::{Cell, RefCell};
use std::sync::OnceLock;
use std::time::Duration;

/// How often a worker trims its lists and lets the allocator release freed memory: a
/// burst's leftovers are gone within two intervals (the bound is a minute). A
/// trim costs a few microseconds, and nothing while the lists are in use.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// A worker's list of spare `T`s, at most `cap` of them. One thread: no lock.
pub struct Spares<T> {
    items: RefCell<Vec<T>>,
    /// The fewest items the list held since the last trim: that many sat unused.
    low: Cell<usize>,
    cap: usize,
}

impl<T> Spares<T> {
    pub const fn new(cap: usize) -> Spares<T> {
        Spares {
            items: RefCell::new(Vec::new()),
            low: Cell::new(0),
            cap,
        }
    }

    /// A spare, if there is one.
    #[inline]
    pub fn take(&self) -> Option<T> {
        let mut items = self.items.borrow_mut();
        let item = items.pop();
        self.low.set(self.low.get().min(items.len()));
        item
    }

    /// Keeps `item` for the next [`take`](Self::take), unless the list is full (then it
    /// is dropped).
    #[inline]
    pub fn give(&self, item: T) {
        let mut items = self.items.borrow_mut();
        if items.len() < self.cap {
            items.push(item);
        }
    }

    pub fn len(&self) -> usize {
        self.items.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the spares nobody took since the last trim (the oldest: the top of the list
    /// is the most recently used, still warm in the cache); how many.
    pub fn trim(&self) -> usize {
        let mut items = self.items.borrow_mut();
        let unused = self.low.get().min(items.len());
        items.drain(..unused);
        if items.capacity() > 2 * items.len() {
            items.shrink_to_fit();
        }
        self.low.set(items.len());
        unused
    }
}

/// The allocator's release of freed memory, registered once by the binary.
static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Registers `release`, called on each worker thread after it trims (it releases that
/// thread's freed memory). A second registration is ignored.
pub fn set_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Lets the allocator return this thread's freed memory to the system, if the binary said
/// how.
pub(crate) fn release() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_drops_what_sat_unused_since_the_last_one() {
        let spares = Spares::new(8);
        // A burst: six out at once (the list was empty), then back.
        for i in 0..6 {
            spares.give(i);
        }
        assert_eq!(spares.trim(), 0, "they were all in use since the last trim");
        // A steady load from then on: two taken and given back, again and again.
        for _ in 0..10 {
            let (a, b) = (spares.take().unwrap(), spares.take().unwrap());
            spares.give(a);
            spares.give(b);
        }
        assert_eq!(spares.trim(), 4, "four never left the list: the oldest go");
        assert_eq!((spares.take(), spares.take()), (Some(5), Some(4)));
        spares.give(4);
        spares.give(5);
        assert_eq!(spares.trim(), 0, "both were taken");
        // Quiet: nothing taken for a whole interval, so nothing is kept.
        assert_eq!(spares.trim(), 2);
        assert!(spares.is_empty());
    }

    #[test]
    fn the_list_keeps_at_most_its_cap() {
        let spares = Spares::new(3);
        for i in 0..5 {
            spares.give(i);
        }
        assert_eq!(spares.len(), 3);
    }
}
