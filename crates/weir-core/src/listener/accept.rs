//! The accept loop of one listener on one worker.
//!
//! At the connection limit it stops accepting until a connection closes (the kernel backlog
//! holds the rest). When the process runs out of file descriptors (EMFILE / ENFILE, seed
//! 002's crash) it logs, backs off briefly and keeps serving the connections it has:
//! running out of descriptors never ends the process.

use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use crate::metrics::shard::accept_error_index;
use crate::worker::{ConnectionGuard, Worker};

/// How long to pause accepting after a resource error.
const RESOURCE_BACKOFF: Duration = Duration::from_millis(50);
/// At most one resource-error log line per listener per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

pub async fn accept_loop(
    worker: Rc<Worker>,
    listener_index: usize,
    listener: TcpListener,
    limit: usize,
) {
    let mut last_log: Option<Instant> = None;
    let mut suppressed = 0u64;
    let tcp = worker.snapshot().config.listeners[listener_index]
        .tcp()
        .is_some();
    loop {
        if !wait_below_limit(&worker, listener_index, limit).await {
            return;
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = worker.drained() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                // TCP_NODELAY is inherited from the listening socket (see `bind`).
                let guard = ConnectionGuard::new(worker.clone(), listener_index);
                let w = worker.clone();
                if tcp {
                    tokio::task::spawn_local(async move {
                        crate::tcp::serve_tcp(w, listener_index, stream, peer).await;
                        drop(guard);
                    });
                } else {
                    tokio::task::spawn_local(async move {
                        crate::proxy::serve_client(w, listener_index, stream, peer).await;
                        drop(guard);
                    });
                }
            }
            Err(e) if is_resource_exhaustion(&e) => {
                worker.metrics.listeners[listener_index].accept_errors[accept_error_index(&e)]
                    .inc();
                if last_log.is_none_or(|t| t.elapsed() >= LOG_INTERVAL) {
                    tracing::warn!(error = %e, suppressed, "accept failed: out of resources; pausing accepts, open connections keep being served");
                    last_log = Some(Instant::now());
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::select! {
                    _ = tokio::time::sleep(RESOURCE_BACKOFF) => {}
                    _ = worker.drained() => return,
                }
            }
            Err(e) => {
                worker.metrics.listeners[listener_index].accept_errors[accept_error_index(&e)]
                    .inc();
                tracing::debug!(error = %e, "accept failed");
            }
        }
    }
}

/// Waits until this worker's share of the listener's connections is below `limit`.
/// Returns false when the worker starts draining instead.
async fn wait_below_limit(worker: &Worker, listener_index: usize, limit: usize) -> bool {
    loop {
        if worker.is_draining() {
            return false;
        }
        let closed = worker.connection_closed.notified();
        if worker.connections.borrow()[listener_index] < limit {
            return true;
        }
        tokio::select! {
            _ = closed => {}
            _ = worker.drained() => return false,
        }
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}
