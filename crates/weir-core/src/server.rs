//! Starting and stopping the data plane: binding every listener once per worker, spawning
//! the worker threads, and the graceful drain on shutdown.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};
use weir_config::Config;

use crate::access_log::{ListenerSinks, LogBuffer, WriterThread, FLUSH_INTERVAL};
use crate::listener::{accept_loop, bind_reuseport};
use crate::metrics::{Metrics, WorkerMetrics};
use crate::snapshot::Snapshot;
use crate::worker::{Shared, Worker};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("listener {listener:?}: cannot bind {addr}: {source}")]
    Bind {
        listener: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot open access log: {0}")]
    AccessLog(std::io::Error),
}

/// A running data plane. Dropping it without `shutdown` leaves the workers running until
/// the process exits.
pub struct Proxy {
    shutdown: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    bound: Vec<(String, SocketAddr)>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    log_writers: Vec<WriterThread>,
}

impl Proxy {
    /// Binds all listeners (so `start` returning means they accept) and starts `workers` threads.
    pub fn start(config: Config, workers: usize) -> Result<Proxy, StartError> {
        let workers = workers.max(1);
        let (sockets, bound) = bind_all(&config, workers)?;
        let limits: Vec<usize> = config
            .listeners
            .iter()
            .map(|l| l.max_connections.div_ceil(workers).max(1))
            .collect();
        let splice_available = probe_splice(&config);
        let (tx, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::new(Arc::new(config))),
            generation: AtomicU64::new(0),
            shutdown: rx,
            workers,
            splice_available,
        });
        let metrics = Arc::new(Metrics::default());
        *metrics.server_up.lock().unwrap_or_else(|e| e.into_inner()) =
            shared.snapshot.load().server_up_flags();
        let (log_sinks, log_writers) = crate::access_log::start_all(
            &shared.snapshot.load().config,
            &metrics.access_log_dropped,
        )
        .map_err(StartError::AccessLog)?;
        let mut threads = Vec::with_capacity(workers + 1);
        // Active health checks: one thread for the process, following the snapshot.
        threads.push(crate::upstream::health::spawn(shared.clone()).map_err(StartError::Thread)?);
        for (index, sockets) in sockets.into_iter().enumerate() {
            let shard = Arc::new(WorkerMetrics::new(&shared.snapshot.load().config));
            metrics.add_shard(shard.clone());
            let shared = shared.clone();
            let setup = WorkerSetup {
                shared,
                metrics: shard,
                sockets,
                limits: limits.clone(),
                logs: log_sinks.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("weir-worker-{index}"))
                .spawn(move || run_worker(setup))
                .map_err(StartError::Thread)?;
            threads.push(thread);
        }
        Ok(Proxy {
            shutdown: tx,
            threads,
            bound,
            shared,
            metrics,
            log_writers,
        })
    }

    /// The address a listener actually bound (useful with port 0).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.bound.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.shared.snapshot.load().config.clone()
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
        move || crate::metrics::encode_text(&metrics, &shared.snapshot.load().config)
    }

    /// Stops accepting, lets in-flight requests finish within the config's `drain_timeout`,
    /// then returns.
    pub fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for thread in self.threads {
            let _ = thread.join();
        }
        // The workers (and with them the log sinks) are gone: writers drain and end.
        for writer in self.log_writers {
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

type WorkerSockets = Vec<Vec<std::net::TcpListener>>;

/// One socket per listener per worker, all on the address the first one got.
fn bind_all(
    config: &Config,
    workers: usize,
) -> Result<(WorkerSockets, Vec<(String, SocketAddr)>), StartError> {
    let mut sockets: WorkerSockets = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for l in &config.listeners {
        let err = |addr, source| StartError::Bind {
            listener: l.name.clone(),
            addr,
            source,
        };
        let first = bind_reuseport(l.bind, l.backlog).map_err(|e| err(l.bind, e))?;
        let addr = first.local_addr().map_err(|e| err(l.bind, e))?;
        sockets[0].push(first);
        for worker_sockets in sockets.iter_mut().skip(1) {
            worker_sockets.push(bind_reuseport(addr, l.backlog).map_err(|e| err(addr, e))?);
        }
        bound.push((l.name.clone(), addr));
    }
    Ok((sockets, bound))
}

/// What a worker thread starts with.
struct WorkerSetup {
    shared: Arc<Shared>,
    metrics: Arc<WorkerMetrics>,
    sockets: Vec<std::net::TcpListener>,
    limits: Vec<usize>,
    logs: ListenerSinks,
}

fn run_worker(setup: WorkerSetup) {
    let WorkerSetup {
        shared,
        metrics,
        sockets,
        limits,
        logs,
    } = setup;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot build worker runtime");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let logs = logs
            .into_iter()
            .map(|l| l.map(|(format, sink)| LogBuffer::new(format, sink)))
            .collect();
        let worker = Rc::new(Worker::new(shared.clone(), metrics, logs));
        tokio::task::spawn_local(flush_logs_periodically(worker.clone()));
        for (index, (socket, limit)) in sockets.into_iter().zip(limits).enumerate() {
            match TcpListener::from_std(socket) {
                Ok(listener) => {
                    tokio::task::spawn_local(accept_loop(worker.clone(), index, listener, limit));
                }
                Err(e) => tracing::error!(error = %e, "cannot register listener"),
            }
        }
        let mut shutdown = shared.shutdown.clone();
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
        drain(&worker).await;
        worker.flush_logs();
    });
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
