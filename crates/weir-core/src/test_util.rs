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

/// What a proxy's threads share, for `snapshot`: one worker, never shut down.
pub fn shared(snapshot: crate::snapshot::Snapshot) -> crate::worker::Shared {
    crate::worker::Shared {
        snapshot: arc_swap::ArcSwap::from_pointee(snapshot),
        generation: Default::default(),
        // The sender is dropped: these tests do not run a worker's life (`server`).
        shutdown: tokio::sync::watch::channel(false).1,
        workers: 1,
        splice_available: false,
        cluster: tokio::sync::mpsc::unbounded_channel().0,
    }
}

/// A worker of the config `toml` (nothing bound, no access log), for a test running a part
/// of the data plane on a `LocalSet` or a `LocalRuntime`; with its first listener's metric slot.
pub fn worker(toml: &str) -> (std::rc::Rc<crate::worker::Worker>, usize) {
    let config = Arc::new(weir_config::parse_str(toml, "t.toml").unwrap());
    let slots = crate::metrics::layout::Layout::default().assign(&config);
    let (listener, metrics) = (
        slots.listeners[0].slot,
        crate::metrics::WorkerMetrics::new(&slots),
    );
    let snapshot = crate::snapshot::Snapshot::new(config, slots, Vec::new()).unwrap();
    let worker =
        crate::worker::Worker::new_rc(Arc::new(shared(snapshot)), Arc::new(metrics), Vec::new());
    (worker, listener)
}
