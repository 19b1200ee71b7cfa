//! Helpers shared by the unit tests of several modules.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

/// A waker that counts its wake-ups.
#[derive(Debug, Default)]
pub struct CountingWaker(AtomicUsize);

impl CountingWaker {
    /// A new counter and a waker that counts into it.
    pub fn new() -> (Arc<CountingWaker>, Waker) {
        let count = Arc::new(CountingWaker::default());
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    pub fn woken(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
