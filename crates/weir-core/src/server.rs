//! Starting and stopping the data plane: binding every listener once per worker, spawning
//! the worker threads, and the graceful drain on shutdown. Config changes after start go
//! through `reload`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};
use tokio::time::{timeout_at, Instant};
use weir_config::{Bind, Config, Listener};

use crate::access_log::{ListenerSinks, LogBuffer, WriterThread, FLUSH_INTERVAL};
use crate::listener::{
    bind_unlistened, control_loop, refuse_foreign_listener, set_defer_accept, Command,
};
use crate::metrics::layout::Layout;
use crate::metrics::{Metrics, WorkerMetrics};
use crate::reload::{Applier, Bound, Control};

use crate::snapshot::Snapshot;
use crate::worker::{Shared, Worker};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `error` is shown in the message and is not a `source`, so that a chain printer
    /// (`{:#}` of anyhow) does not say it twice.
    #[error("listener {listener:?}: cannot bind {addr}: {error}{}", implied_hint(*.implied))]
    Bind {
        listener: String,
        addr: SocketAddr,
        /// The port-80 bind `acme` implies (not written in the config).
        implied: bool,
        error: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    AccessLog(crate::access_log::OpenError),
    #[error(transparent)]
    Tls(#[from] crate::snapshot::ListenerTlsError),
    #[error(transparent)]
    UpstreamTls(#[from] crate::connector::tls::TlsSetupError),
}

impl StartError {
    /// The config key at fault and how to fix it, for the errors about a file the config
    /// names (a certificate, key or CA): shown at the key's position like a config error.
    pub fn located(&self) -> Option<(String, String)> {
        match self {
            StartError::Tls(e) => Some((e.field.clone(), e.fix())),
            StartError::UpstreamTls(e) => Some((
                format!("upstreams.{}.tls", e.upstream),
                "give a certificate and key that belong together, in PEM".to_string(),
            )),
            StartError::AccessLog(e) => {
                Some((format!("listeners[{}].access_log.path", e.index), e.fix()))
            }
            _ => None,
        }
    }
}

/// What a failed implied bind adds to its error: where it came from and how to change it.
fn implied_hint(implied: bool) -> &'static str {
    if implied {
        " (the port-80 address acme implies for HTTP-01 and the redirect to HTTPS: set \
         http_bind to another address, or http_bind = \"off\")"
    } else {
        ""
    }
}

/// A running data plane. Dropping it without `shutdown` leaves the workers running until
/// the process exits.
pub struct Proxy {
    shutdown: watch::Sender<bool>,
    /// Taken by `shutdown` (which may be called through an `Arc`).
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) metrics: Arc<Metrics>,
    log_writers: Mutex<Vec<WriterThread>>,
    /// Listener sockets and metric slots; the lock serializes config changes.
    pub(crate) control: Arc<Mutex<Control>>,
}

impl Proxy {
    /// Binds all listeners (so `start` returning means they accept) and starts `workers` threads.
    pub fn start(config: Config, workers: usize) -> Result<Proxy, StartError> {
        Proxy::start_inherited(config, workers, Vec::new())
    }

    /// Like `start`, accepting on `inherited` sockets where a listener matches one (a binary
    /// upgrade). Inherited sockets no listener takes are closed.
    pub fn start_inherited(
        config: Config,
        workers: usize,
        mut inherited: Inherited,
    ) -> Result<Proxy, StartError> {
        let workers = workers.max(1);
        let upstream_tls = crate::connector::tls::build_all(&config, &[])?;
        let mut layout = Layout::default();
        let slots = layout.assign(&config);
        let splice_available = probe_splice(&config);
        let (tx, rx) = watch::channel(false);
        let (cluster, batches) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::new(Arc::new(config), slots, upstream_tls)?),
            generation: AtomicU64::new(0),
            shutdown: rx,
            workers,
            splice_available,
            cluster,
        });
        let snapshot = shared.snapshot.load_full();
        let (mut control, receivers) = Control::new(layout, workers);
        bind_all(&snapshot, &mut control, workers, &mut inherited)?;
        let metrics = Arc::new(Metrics::default());
        let (log_sinks, log_writers) =
            crate::access_log::start_all(&snapshot.config, &metrics.access_log_dropped)
                .map_err(StartError::AccessLog)?;
        let mut threads = Vec::with_capacity(workers + 1);
        // Active health checks: one thread for the process, following the snapshot.
        threads.push(crate::upstream::health::spawn(shared.clone()).map_err(StartError::Thread)?);
        threads.push(crate::tls::watch::spawn(shared.clone()).map_err(StartError::Thread)?);
        threads.push(crate::tls::auto::manager::spawn(shared.clone()).map_err(StartError::Thread)?);
        for (index, commands) in receivers.into_iter().enumerate() {
            let shard = Arc::new(WorkerMetrics::new(&snapshot.slots));
            metrics.add_shard(shard.clone());
            let setup = WorkerSetup {
                shared: shared.clone(),
                metrics: shard,
                commands,
                logs: log_sinks.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("weir-worker-{index}"))
                .spawn(move || run_worker(setup))
                .map_err(StartError::Thread)?;
            threads.push(thread);
        }
        let applier = Applier {
            shared: shared.clone(),
            metrics: metrics.clone(),
            control: Arc::new(Mutex::new(control)),
        };
        let (thread, first_round) =
            crate::cluster::spawn(applier.clone(), batches).map_err(StartError::Thread)?;
        threads.push(thread);
        let discovered = snapshot.config.upstreams.iter();
        let discovered = discovered.filter_map(|u| u.discover.as_ref());
        if let Some(limit) = discovered.clone().map(|d| d.timeout).max() {
            crate::cluster::wait_first_round(&first_round, discovered.count(), limit * 2);
        }
        Ok(Proxy {
            shutdown: tx,
            threads: Mutex::new(threads),
            shared,
            metrics,
            log_writers: Mutex::new(log_writers),
            control: applier.control,
        })
    }

    /// What applying a config needs, for the threads that change the config too.
    pub(crate) fn applier(&self) -> Applier {
        Applier {
            shared: self.shared.clone(),
            metrics: self.metrics.clone(),
            control: self.control.clone(),
        }
    }

    /// The address a listener's first `bind` actually bound (useful with port 0).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.lock_control().addr_of(name)
    }

    /// Every address a listener bound, with its kind (its `bind` ones first at start; a
    /// reload that adds binds appends them).
    pub fn listener_addrs(&self, name: &str) -> Vec<BoundAddr> {
        self.lock_control().addrs_of(name)
    }

    /// Duplicates of every listener's sockets, by listener name, to hand to a new process.
    pub fn listening_sockets(&self) -> std::io::Result<Inherited> {
        self.lock_control().duplicate_sockets()
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.shared.snapshot.load().config.clone()
    }

    /// The running snapshot (config plus derived state such as server health).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// The metrics of all workers.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// A function rendering all metrics in the Prometheus text format (what `/metrics`
    /// serves), callable from any thread.
    pub fn metrics_renderer(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let metrics = self.metrics.clone();
        let shared = self.shared.clone();
        move || crate::metrics::encode_text(&metrics, &shared.snapshot.load())
    }

    pub(crate) fn lock_control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops accepting, lets in-flight requests finish within the config's `drain_timeout`,
    /// then returns. Later calls return at once.
    pub fn shutdown(&self) {
        // Close the duplicates kept for upgrades first: once the workers stop accepting,
        // new connections must be refused, not left waiting in a backlog nobody reads.
        self.lock_control().forget_sockets();
        let _ = self.shutdown.send(true);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
        // Every span has ended with the workers: the queued ones go to the collector.
        if let Some(tracer) = &self.shared.snapshot.load().tracer {
            tracer.flush(std::time::Instant::now() + tracer.config.timeout);
        }
        // The workers (and with them the log sinks) are gone: writers drain and end.
        let writers =
            std::mem::take(&mut *self.log_writers.lock().unwrap_or_else(|e| e.into_inner()));
        for writer in writers {
            writer.join();
        }
    }
}

/// Whether TCP listeners can splice; logged once when the config has TCP listeners.
fn probe_splice(config: &Config) -> bool {
    let available = crate::sys::splice_available();
    let tcp: Vec<_> = config
        .listeners
        .iter()
        .filter_map(|l| Some((l.name.as_str(), l.tcp()?.splice)))
        .collect();
    if !tcp.is_empty() {
        if available {
            tracing::info!(listeners = ?tcp, "tcp relay: splice(2) available (auto: bulk transfers splice, small exchanges copy; off: always copy)");
        } else {
            tracing::info!(listeners = ?tcp, "tcp relay: splice(2) not available here; copying through buffers");
        }
    }
    available
}

/// An address a listener bound, as [`Proxy::listener_addrs`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundAddr {
    pub addr: SocketAddr,
    /// One of a TLS listener's plain-HTTP addresses (`http_bind`).
    pub plain_http: bool,
}

/// Sockets for one `bind` of `listener`: the `inherited` ones (a binary upgrade hands them
/// over) and fresh SO_REUSEPORT binds on the same address until every worker has one.
pub(crate) fn bind_per_worker(
    listener: &Listener,
    bind: &Bind,
    workers: usize,
    inherited: Vec<std::net::TcpListener>,
) -> Result<Bound, StartError> {
    let err = |addr, error| StartError::Bind {
        listener: listener.name.clone(),
        addr,
        implied: bind.implied,
        error,
    };
    let http3 = takes_http3(listener, bind);
    // Port 0 with HTTP/3: the kernel picks a port free over TCP, and UDP must take the
    // same number, which a UDP socket elsewhere may hold: then another port.
    let mut retries = if bind.addr.port() == 0 && http3 && inherited.is_empty() {
        8
    } else {
        0
    };
    let mut inherited = Some(inherited);
    loop {
        let inherited = inherited.take().unwrap_or_default();
        let (addr, sockets) =
            bind_tcp(listener, bind, workers, inherited).map_err(|(addr, e)| err(addr, e))?;
        let quic = match http3 {
            false => Vec::new(),
            true => match (0..workers).map(|_| crate::http3::bind_udp(addr)).collect() {
                Ok(quic) => quic,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && retries > 0 => {
                    retries -= 1;
                    continue;
                }
                Err(e) => return Err(err(addr, udp_error(e))),
            },
        };
        return Ok(Bound {
            bind: *bind,
            addr,
            sockets,
            quic,
            limit: listener.max_connections,
        });
    }
}

/// Has the sockets [`bind_per_worker`] bound (not listening yet, but for inherited ones)
/// listen with `listener`'s backlog: only then does the kernel queue connections on them.
pub(crate) fn listen_bound(listener: &Listener, bound: &Bound) -> Result<(), StartError> {
    for socket in &bound.sockets {
        crate::listener::listen(socket, listener.backlog).map_err(|error| StartError::Bind {
            listener: listener.name.clone(),
            addr: bound.addr,
            implied: bound.bind.implied,
            error,
        })?;
    }
    Ok(())
}

/// The TCP sockets of [`bind_per_worker`] (bound, not listening: see [`listen_bound`]),
/// and the address they got; on error, the address it was about.
fn bind_tcp(
    listener: &Listener,
    bind: &Bind,
    workers: usize,
    inherited: Vec<std::net::TcpListener>,
) -> Result<(SocketAddr, Vec<std::net::TcpListener>), (SocketAddr, std::io::Error)> {
    let at = |addr| move |e| (addr, e);
    let mut sockets = inherited;
    for s in &sockets {
        s.set_nonblocking(true).map_err(at(bind.addr))?;
        set_defer_accept(s, listener.defer_accept).map_err(at(bind.addr))?;
    }
    if sockets.is_empty() {
        // Only the first socket: the workers' others join it on purpose (SO_REUSEPORT).
        refuse_foreign_listener(bind.addr).map_err(at(bind.addr))?;
        let first = bind_unlistened(bind.addr, listener.defer_accept);
        sockets.push(first.map_err(at(bind.addr))?);
    }
    let addr = sockets[0].local_addr().map_err(at(bind.addr))?;
    while sockets.len() < workers {
        let next = bind_unlistened(addr, listener.defer_accept);
        sockets.push(next.map_err(at(addr))?);
    }
    Ok((addr, sockets))
}

/// Whether `bind` of `listener` also serves HTTP/3 (UDP sockets): its TLS binds, when
/// `http3` is on.
pub(crate) fn takes_http3(listener: &Listener, bind: &Bind) -> bool {
    listener.http3.is_some() && !bind.plain_http
}

/// `error` binding a listener's UDP socket (HTTP/3), said to be UDP's: the TCP port of the
/// same number was free.
fn udp_error(error: std::io::Error) -> std::io::Error {
    std::io::Error::new(error.kind(), format!("UDP (http3): {error}"))
}

/// The listening sockets of one bind of a listener, handed over by the process being
/// upgraded.
#[derive(Debug)]
pub struct InheritedBind {
    pub listener: String,
    /// A plain-HTTP bind of a TLS listener (`http_bind`).
    pub plain_http: bool,
    pub sockets: Vec<std::net::TcpListener>,
}

/// Listening sockets handed over by the process being upgraded.
pub type Inherited = Vec<InheritedBind>;

/// Binds every listener's addresses (`workers` sockets each, or the `inherited` one a
/// binary upgrade handed over) and gives them to the workers through `control`.
fn bind_all(
    snapshot: &Snapshot,
    control: &mut Control,
    workers: usize,
    inherited: &mut Inherited,
) -> Result<(), StartError> {
    let listeners = snapshot.config.listeners.iter();
    for (listener, slots) in listeners.zip(&*snapshot.slots.listeners) {
        for bind in &listener.binds {
            let inherited = take_inherited(inherited, listener, bind);
            let bound = bind_per_worker(listener, bind, workers, inherited)?;
            listen_bound(listener, &bound)?;
            control.listen(listener, slots.slot, bound);
        }
    }
    Ok(())
}

/// Takes the inherited sockets of `bind` of `listener`: same listener name and kind of
/// bind, and the configured address unless it asks for any port (`:0`), in which case the
/// port the old process got is kept. A listener renamed in the new config takes the
/// sockets bound to its exact address: the old process keeps listening there while it
/// drains, so a fresh bind would be refused as another process's address
/// (`refuse_foreign_listener`).
fn take_inherited(
    inherited: &mut Inherited,
    listener: &Listener,
    bind: &Bind,
) -> Vec<std::net::TcpListener> {
    let addr_of = |old: &InheritedBind| old.sockets.first()?.local_addr().ok();
    let by_name = |old: &InheritedBind| {
        old.listener == listener.name
            && old.plain_http == bind.plain_http
            && addr_of(old).is_some_and(|a| {
                a == bind.addr || (bind.addr.port() == 0 && a.ip() == bind.addr.ip())
            })
    };
    let by_addr = |old: &InheritedBind| bind.addr.port() != 0 && addr_of(old) == Some(bind.addr);
    let found = inherited
        .iter()
        .position(by_name)
        .or_else(|| inherited.iter().position(by_addr));
    match found {
        Some(i) => inherited.swap_remove(i).sockets,
        None => Vec::new(),
    }
}

/// What a worker thread starts with.
struct WorkerSetup {
    shared: Arc<Shared>,
    metrics: Arc<WorkerMetrics>,
    commands: mpsc::UnboundedReceiver<Command>,
    logs: ListenerSinks,
}

fn run_worker(setup: WorkerSetup) {
    let WorkerSetup {
        shared,
        metrics,
        commands,
        logs,
    } = setup;
    // A local runtime, not a current-thread runtime with a `LocalSet`: the worker's tasks
    // (`spawn_local`) are the runtime's own, scheduled without the `LocalSet`'s queue, its
    // tick inside the `block_on` future and its waker (about 240 instructions per wake-up
    // of the worker, two per proxied request: `bench/instructions.sh`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(tokio::runtime::LocalOptions::default())
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot build worker runtime");
            return;
        }
    };
    // The worker's life is a task of its own: `block_on` polls the future it is given each
    // time it is woken, and polling the shutdown watch there cost about 200 instructions
    // each time (a JoinHandle, 120).
    let ended = Rc::new(Ended::default());
    let end = EndOnDrop(ended.clone());
    runtime.spawn_local(async move {
        // Also when the task ends by a panic (tokio catches it: the thread would wait forever).
        let _end = end;
        let logs = logs
            .into_iter()
            .map(|l| l.map(|(format, sink)| LogBuffer::new(format, sink)))
            .collect();
        let worker = Worker::new_rc(shared.clone(), metrics, logs);
        tokio::task::spawn_local(flush_logs_periodically(worker.clone()));
        tokio::task::spawn_local(trim_periodically(worker.clone()));
        tokio::task::spawn_local(control_loop(worker.clone(), commands));
        tokio::task::spawn_local(crate::cluster::shared_limit::sync_task(worker.clone()));
        let mut shutdown = shared.shutdown.clone();
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
        drain(&worker).await;
        worker.flush_logs();
    });
    runtime.block_on(WaitEnded(&ended));
}

/// The end of a worker's life: set by its task, awaited by `block_on` (one thread, so a
/// `Cell` and the one waker to call).
#[derive(Default)]
struct Ended {
    done: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Ended {
    fn set(&self) {
        self.done.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// Sets the [`Ended`] it holds when dropped.
struct EndOnDrop(Rc<Ended>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Ready once [`Ended::set`] was called.
struct WaitEnded<'a>(&'a Ended);

impl Future for WaitEnded<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.done.get() {
            return Poll::Ready(());
        }
        let mut waker = self.0.waker.borrow_mut();
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Stops accepting and waits (up to `drain_timeout`) for open connections to finish.
async fn drain(worker: &Worker) {
    worker.begin_drain();
    let drain_timeout = worker.snapshot().config.server.drain_timeout;
    let deadline = Instant::now() + drain_timeout;
    loop {
        let closed = worker.connection_closed.notified();
        let open = worker.open_connections();
        if open == 0 {
            return;
        }
        if timeout_at(deadline, closed).await.is_err() {
            tracing::warn!(open, "drain_timeout reached; closing remaining connections");
            return;
        }
    }
}

/// Bounds how long an access-log line waits in a quiet worker's buffer.
async fn flush_logs_periodically(worker: Rc<Worker>) {
    if worker.logs.iter().all(Option::is_none) {
        return;
    }
    let mut tick = tokio::time::interval(FLUSH_INTERVAL);
    loop {
        tick.tick().await;
        worker.flush_logs();
    }
}

/// Frees what a burst left behind: spares unused for a `TRIM_INTERVAL`, the memory the
/// allocator holds for this thread (`memory`), and the snapshot an idle worker cached
/// before the last reload (it would keep the metric slots of servers DNS dropped since,
/// `metrics::layout`).
async fn trim_periodically(worker: Rc<Worker>) {
    let mut tick = tokio::time::interval(crate::memory::TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let snapshot = worker.snapshot();
        let longest_idle = snapshot
            .config
            .upstreams
            .iter()
            .map(|u| u.idle_timeout)
            .max();
        drop(snapshot);
        let now = std::time::Instant::now();
        let longest_idle = longest_idle.unwrap_or_default();
        worker.pool.borrow_mut().sweep(longest_idle, now);
        worker.h2_pool.borrow_mut().sweep(now);
        worker.trim_spares();
    }
}

/// A thread named `name` running `task` on a current-thread tokio runtime of its own (the
/// health checks, the certificate watcher).
pub(crate) fn spawn_with_runtime<F, Fut>(name: &str, task: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let thread = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(task()),
                Err(e) => tracing::error!(thread, error = %e, "cannot build a tokio runtime"),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload binds every new listener before any listens (F3): a connection the kernel
    /// queued on a socket that a later bind failure then drops would be reset.
    #[test]
    fn bound_sockets_take_no_connection_until_they_listen() {
        let toml = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
                    [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n\
                    [upstreams.u]\nservers = [{ addr = \"127.0.0.1:9\" }]\n";
        let config = weir_config::parse_str(toml, "t.toml").unwrap();
        let listener = &config.listeners[0];
        let bound = bind_per_worker(listener, &listener.binds[0], 2, Vec::new()).unwrap();
        let refused = std::net::TcpStream::connect(bound.addr).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        listen_bound(listener, &bound).unwrap();
        assert!(std::net::TcpStream::connect(bound.addr).is_ok());
    }

    #[test]
    fn a_worker_ends_when_its_task_ends_even_by_a_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build_local(tokio::runtime::LocalOptions::default())
            .unwrap();
        for panics in [false, true] {
            let ended = Rc::new(Ended::default());
            let end = EndOnDrop(ended.clone());
            runtime.spawn_local(async move {
                let _end = end;
                tokio::task::yield_now().await;
                assert!(!panics, "the task's own panic");
            });
            // Returns only once the task has ended (a hang fails the test by its timeout).
            runtime.block_on(WaitEnded(&ended));
            assert!(ended.done.get());
        }
    }
}
