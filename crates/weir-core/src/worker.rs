//! One worker: a thread with its own single-threaded tokio runtime, its own listening
//! sockets (SO_REUSEPORT), its own upstream pool and load-balancing state.
//!
//! Nothing here is shared with other workers except `Shared` (the published snapshot and the
//! shutdown signal), which the request path reads without locks or atomic read-modify-write.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use arc_swap::ArcSwap;
use tokio::sync::{watch, Notify};

use crate::access_log::LogBuffer;
use crate::buffer::Buffer;
use crate::connector::IdlePool;
use crate::listener::cap::Permit;
use crate::memory::Spares;
use crate::metrics::WorkerMetrics;
use crate::places::Places;
use crate::snapshot::Snapshot;
use crate::sys::Pipe;
use crate::upstream::WorkerUpstreams;

/// State shared by all workers.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    /// Bumped on every publish, so workers notice a new snapshot with a plain load.
    pub generation: AtomicU64,
    pub shutdown: watch::Receiver<bool>,
    /// Number of workers (each enforces its share of an upstream server's
    /// `max_connections`).
    pub workers: usize,
    /// Whether the kernel can splice (probed once at start; TCP listeners copy otherwise).
    pub splice_available: bool,
    /// Where the workers' sync tasks send the counts of shared rate limits.
    pub cluster: tokio::sync::mpsc::UnboundedSender<Vec<crate::cluster::shared_limit::Batch>>,
}

impl Shared {
    /// Makes `snapshot` the running one; returns the one it replaced, whose epoch it
    /// follows (metrics::layout: a slot freed now waits on the replaced snapshot's epoch,
    /// whatever published that snapshot).
    pub fn publish(&self, snapshot: Snapshot) -> Arc<Snapshot> {
        let new = Arc::new(snapshot);
        let replaced = self.snapshot.swap(new.clone());
        self.published(&replaced, &new);
        replaced
    }

    /// Makes `snapshot` the running one if `current` still is; false if another was
    /// published meanwhile (then nothing changed).
    pub fn publish_if(&self, current: &Arc<Snapshot>, snapshot: Snapshot) -> bool {
        let new = Arc::new(snapshot);
        let before = self.snapshot.compare_and_swap(current, new.clone());
        let swapped = Arc::ptr_eq(&before, current);
        if swapped {
            self.published(current, &new);
        }
        swapped
    }

    /// Every publish links the epochs in the order the snapshots ran, and is seen by the
    /// workers through the generation.
    fn published(&self, replaced: &Snapshot, new: &Arc<Snapshot>) {
        replaced.epoch.followed_by(&new.epoch);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// Size of the buffers used for upstream responses.
pub const UPSTREAM_BUFFER: usize = 16 * 1024;
/// Most spare buffers a worker keeps for reuse (client and upstream buffers alike): enough
/// for connection churn and for the streams of a few busy HTTP/2 connections (each stream
/// in an exchange holds one: 32 connections x 16 streams missed a 256-buffer pool on a third
/// of their requests, each miss a zeroed 16 KiB allocation). At most 16 MiB per worker,
/// and only while they are used: spares left unused for a `memory::TRIM_INTERVAL` go.
const SPARE_BUFFERS: usize = 1024;
/// Most spare pipes a worker keeps (two descriptors each).
const SPARE_PIPES: usize = 256;
/// Most spare blocks for requests' futures a worker keeps (`frame`: about 7 KiB each, as
/// many as it had requests in flight at once; trimmed like the buffers).
const SPARE_FRAMES: usize = 256;

pub struct Worker {
    pub shared: Arc<Shared>,
    /// The worker itself, for a task it starts that no connection holds (a cache entry's
    /// revalidation in the background): set where the worker is made (`Rc::new_cyclic`).
    pub me: std::rc::Weak<Worker>,
    /// The snapshot this worker uses, with the generation it was loaded at. `Rc<Arc<_>>` on
    /// purpose: handing it to a request clones the `Rc` (no atomic), not the shared `Arc`.
    #[allow(clippy::redundant_allocation)]
    cached: RefCell<(u64, Rc<Arc<Snapshot>>)>,
    pub pool: RefCell<IdlePool>,
    /// HTTP/2 connections to upstream servers (`connector::h2`).
    pub h2_pool: RefCell<crate::connector::H2Pool>,
    /// Load-balancing state, in-flight counts and retry budgets, per upstream.
    pub upstreams: WorkerUpstreams,
    /// This worker's position in each weighted split's schedule.
    pub splits: crate::upstream::split::SplitCursors,
    spare: Spares<Buffer>,
    /// Spare per-stream heads and span lists for HTTP/2 streams (`http2::scratch`).
    pub(crate) h2_scratch: crate::http2::scratch::Scratches,
    /// Empty pipes kept for the next spliced TCP connection (saves pipe2 + 2 close).
    pipes: Spares<Pipe>,
    /// Memory for the futures of requests in flight (`frame::place`).
    pub(crate) frames: Spares<crate::frame::Block>,
    draining: Cell<bool>,
    /// Tasks waiting in `drained()` (accept loops, HTTP/2 connections; idle HTTP/1
    /// connections are woken through their place in `idle`).
    drain_waiters: DrainWaiters,
    /// Open client connections of this worker, per listener slot.
    connections: RefCell<Vec<usize>>,
    /// Signalled whenever a client connection closes.
    pub connection_closed: Notify,
    /// This worker's metric shard (it is the only writer).
    pub metrics: Arc<WorkerMetrics>,
    /// Access-log buffers, per listener slot (`None`: logging off).
    pub logs: Vec<Option<LogBuffer>>,
    /// TLS handshakes in progress on this worker, per listener (bounded by its
    /// `max_handshakes`; the idlest evicted for a newcomer).
    pub handshakes: Places,
    /// This worker's HTTP connections, per listener, each evictable while it waits for a
    /// request (and TCP connections before their relay): at the listener's `max_connections` the idlest (of these and the
    /// handshakes) is closed for a newcomer (`listener::reclaim`).
    pub idle: Places,
    /// This worker's request-id source.
    pub request_ids: crate::filters::request_id::RequestIds,
    /// Recent successful basic-auth checks (bcrypt is slow on purpose).
    pub auth_cache: crate::filters::basic_auth::AuthCache,
    /// What this worker admitted under shared rate limits since their last sync.
    pub shared_counts: crate::cluster::shared_limit::PendingCounts,
    /// Open files kept for the routes' `files` (`files::cache`).
    pub(crate) open_files: RefCell<crate::files::cache::OpenFiles>,
    /// Cache entries' revalidations in the background (`proxy::revalidate`), at most
    /// `[server] background_revalidations` at a time, aborted when the worker drains.
    pub(crate) revalidations: RefCell<tokio::task::JoinSet<()>>,
}

impl Worker {
    /// The access-log buffer of the listener with metric slot `slot`, if it logs.
    #[inline]
    pub fn log(&self, slot: usize) -> Option<&LogBuffer> {
        self.logs.get(slot)?.as_ref()
    }

    /// [`Worker::new`], shared, knowing itself (`me`).
    pub fn new_rc(
        shared: Arc<Shared>,
        metrics: Arc<WorkerMetrics>,
        logs: Vec<Option<LogBuffer>>,
    ) -> Rc<Worker> {
        Rc::new_cyclic(|me| Worker {
            me: me.clone(),
            ..Worker::new(shared, metrics, logs)
        })
    }

    fn new(
        shared: Arc<Shared>,
        metrics: Arc<WorkerMetrics>,
        logs: Vec<Option<LogBuffer>>,
    ) -> Worker {
        let generation = shared.generation.load(Ordering::Acquire);
        let upstreams = WorkerUpstreams::new(shared.workers, metrics.clone());
        let snapshot = Rc::new(shared.snapshot.load_full());
        Worker {
            shared,
            me: std::rc::Weak::new(),
            cached: RefCell::new((generation, snapshot)),
            pool: RefCell::new(IdlePool::default()),
            h2_pool: RefCell::default(),
            upstreams,
            splits: Default::default(),
            spare: Spares::new(SPARE_BUFFERS),
            h2_scratch: Default::default(),
            pipes: Spares::new(SPARE_PIPES),
            frames: Spares::new(SPARE_FRAMES),
            draining: Cell::new(false),
            drain_waiters: DrainWaiters::default(),
            connections: RefCell::new(Vec::new()),
            connection_closed: Notify::new(),
            metrics,
            logs,
            handshakes: Default::default(),
            idle: Default::default(),
            request_ids: Default::default(),
            auth_cache: Default::default(),
            shared_counts: Default::default(),
            open_files: Default::default(),
            revalidations: Default::default(),
        }
    }

    /// The current snapshot; reloads it only when the generation moved.
    #[allow(clippy::redundant_allocation)]
    pub fn snapshot(&self) -> Rc<Arc<Snapshot>> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut cached = self.cached.borrow_mut();
        if cached.0 != generation {
            *cached = (generation, Rc::new(self.shared.snapshot.load_full()));
        }
        cached.1.clone()
    }

    /// Whether `snapshot` is still the current one (no reload since it was taken): a
    /// connection then keeps what it holds, without a new reference and a new lookup of
    /// its listener per request.
    #[allow(clippy::redundant_allocation)]
    #[inline]
    pub fn is_current(&self, snapshot: &Rc<Arc<Snapshot>>) -> bool {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let cached = self.cached.borrow();
        cached.0 == generation && Rc::ptr_eq(&cached.1, snapshot)
    }

    #[inline]
    pub fn take_buffer(&self) -> Buffer {
        self.spare
            .take()
            .unwrap_or_else(|| Buffer::new(UPSTREAM_BUFFER))
    }

    /// A buffer of `size` bytes: a spare one when `size` is the usual size.
    pub fn take_buffer_sized(&self, size: usize) -> Buffer {
        if size == UPSTREAM_BUFFER {
            self.take_buffer()
        } else {
            Buffer::new(size)
        }
    }

    #[inline]
    pub fn give_buffer(&self, mut buf: Buffer) {
        if buf.capacity() == UPSTREAM_BUFFER {
            buf.clear();
            self.spare.give(buf);
        }
    }

    /// An empty pipe for splicing, reused when possible.
    pub fn take_pipe(&self) -> std::io::Result<Pipe> {
        match self.pipes.take() {
            Some(pipe) => Ok(pipe),
            None => Pipe::new(),
        }
    }

    /// Keeps an empty pipe for reuse (a pipe with bytes left in it is closed instead).
    pub fn give_pipe(&self, pipe: Pipe) {
        self.pipes.give(pipe);
    }

    /// Frees the spares (buffers, pipes, request futures' blocks, HTTP/2 scratch) that sat unused since the last
    /// trim, then lets the allocator release this thread's freed memory (`memory`).
    pub fn trim_spares(&self) {
        self.spare.trim();
        self.pipes.trim();
        self.frames.trim();
        self.h2_scratch.trim();
        crate::memory::release();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Stops accepting and wakes idle connections so they close.
    pub fn begin_drain(&self) {
        self.draining.set(true);
        // A revalidation has no client to finish for; it holds its key and snapshot.
        self.revalidations.borrow_mut().abort_all();
        self.drain_waiters.wake_all();
        self.idle.wake_all();
        self.pool.borrow_mut().clear();
    }

    /// Resolves when the worker starts draining (immediately if it already has).
    pub fn drained(&self) -> Drained<'_> {
        Drained {
            worker: self,
            slot: None,
        }
    }

    /// Hands every buffered access-log line to its writer.
    pub fn flush_logs(&self) {
        self.logs.iter().flatten().for_each(LogBuffer::flush);
    }

    pub fn open_connections(&self) -> usize {
        self.connections.borrow().iter().sum()
    }

    /// Counts a listener's connection opening or closing; returns its open connections.
    fn count_connection(&self, slot: usize, opened: bool) -> usize {
        let mut connections = self.connections.borrow_mut();
        if connections.len() <= slot {
            connections.resize(slot + 1, 0);
        }
        let n = &mut connections[slot];
        *n = if opened { *n + 1 } else { n.saturating_sub(1) };
        *n
    }
}

/// Wakers of the tasks waiting for the worker to drain, in reusable slots. Worker-local
/// (no lock): every idle keep-alive wait registered here, once per request (its connection's
/// seat in `Worker::idle` now rests instead, and the drain wakes resting seats), so it replaces a
/// `tokio::sync::Notify`, which locks a mutex to add and again to remove each waiter. (By
/// hand at c=256: dropping the wait altogether saved about 2.5 % of the CPU per request,
/// this registry about 1 %, both within run-to-run noise of 3 %.)
#[derive(Default)]
struct DrainWaiters {
    slots: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl DrainWaiters {
    /// Stores `waker` in `slot` (a new slot when `None`); returns the slot.
    fn register(&self, slot: Option<usize>, waker: &Waker) -> usize {
        let mut slots = self.slots.borrow_mut();
        let i = slot.unwrap_or_else(|| {
            self.free.borrow_mut().pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            })
        });
        match &mut slots[i] {
            Some(w) if w.will_wake(waker) => {}
            entry => *entry = Some(waker.clone()),
        }
        i
    }

    fn release(&self, slot: usize) {
        if let Some(entry) = self.slots.borrow_mut().get_mut(slot) {
            *entry = None;
            self.free.borrow_mut().push(slot);
        }
    }

    fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .slots
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// The future of [`Worker::drained`].
pub struct Drained<'a> {
    worker: &'a Worker,
    slot: Option<usize>,
}

impl Future for Drained<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.worker.draining.get() {
            return Poll::Ready(());
        }
        this.slot = Some(this.worker.drain_waiters.register(this.slot, cx.waker()));
        Poll::Pending
    }
}

impl Drop for Drained<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.worker.drain_waiters.release(slot);
        }
    }
}

/// Counts one open client connection of a listener (by metric slot) for as long as it
/// lives: on its worker (drain, `weir_connections_active`) and, through its `permit`,
/// against the listener's `max_connections`.
pub struct ConnectionGuard {
    worker: Rc<Worker>,
    slot: usize,
    _permit: Permit,
}

impl ConnectionGuard {
    pub fn new(worker: Rc<Worker>, slot: usize, permit: Permit) -> ConnectionGuard {
        let open = worker.count_connection(slot, true);
        if let Some(m) = worker.metrics.listener(slot) {
            m.connections_total.inc();
            m.connections_active.set(open as u64);
        }
        ConnectionGuard {
            worker,
            slot,
            _permit: permit,
        }
    }

    /// The worker the connection is counted on.
    pub fn worker(&self) -> &Rc<Worker> {
        &self.worker
    }

    /// The listener's metric slot.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let open = self.worker.count_connection(self.slot, false);
        if let Some(m) = self.worker.metrics.listener(self.slot) {
            m.connections_active.set(open as u64);
        }
        self.worker.connection_closed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::DrainWaiters;
    use crate::test_util::CountingWaker;

    #[test]
    fn drain_wakes_every_registered_waiter_once_and_slots_are_reused() {
        let waiters = DrainWaiters::default();
        let (counts, wakers): (Vec<_>, Vec<_>) = (0..3).map(|_| CountingWaker::new()).unzip();
        let a = waiters.register(None, &wakers[0]);
        let b = waiters.register(None, &wakers[1]);
        // Re-registering keeps the slot; a released slot is handed out again.
        assert_eq!(waiters.register(Some(a), &wakers[0]), a);
        waiters.release(b);
        let c = waiters.register(None, &wakers[2]);
        assert_eq!(c, b);
        waiters.wake_all();
        waiters.wake_all();
        let woken: Vec<usize> = counts.iter().map(|c| c.woken()).collect();
        assert_eq!(
            woken,
            vec![1, 0, 1],
            "the released waiter is not woken, the others once"
        );
    }

    /// A snapshot that is not the running one (a request in flight holds it) keeps the
    /// epochs after it: whoever published the next snapshots, the chain is unbroken.
    #[test]
    fn every_publish_links_the_replaced_snapshots_epoch() {
        use super::Snapshot;
        use std::sync::Arc;
        let config = weir_config::parse_str(
            "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n",
            "t.toml",
        )
        .unwrap();
        let config = Arc::new(config);
        let mut layout = crate::metrics::layout::Layout::default();
        let mut snapshot =
            || Snapshot::new(config.clone(), layout.assign(&config), Vec::new()).unwrap();
        let shared = crate::test_util::shared(snapshot());
        let in_flight = shared.snapshot.load_full();
        // The certificate watcher's swap, then a reload's publish.
        assert!(shared.publish_if(&in_flight, snapshot()));
        assert!(
            !shared.publish_if(&in_flight, snapshot()),
            "not current any more"
        );
        let replaced = shared.publish(snapshot());
        let waited_on = Arc::downgrade(&replaced.epoch);
        drop(replaced);
        assert!(
            waited_on.upgrade().is_some(),
            "the request in flight keeps it"
        );
        drop(in_flight);
        assert!(waited_on.upgrade().is_none());
        assert_eq!(shared.generation.into_inner(), 2);
    }
}
