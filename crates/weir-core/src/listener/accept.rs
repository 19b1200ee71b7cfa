//! The accept loop of one listener on one worker.
//!
//! At the connection limit it stops accepting until a connection closes (the kernel backlog
//! holds the rest). When the process runs out of file descriptors (EMFILE / ENFILE, seed
//! 002's crash) it logs, backs off briefly and keeps serving the connections it has:
//! running out of descriptors never ends the process.

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use tokio::io::unix::AsyncFd;

use super::backoff::{is_resource_exhaustion, ResourceLog, RESOURCE_BACKOFF};
use super::StopSignal;
use crate::client_stream::ClientStream;
use crate::metrics::shard::accept_error_index;
use crate::worker::{ConnectionGuard, Worker};

/// Accepts on `listener` (metric slot `slot`) until the worker drains or `stop` fires;
/// returning closes the socket.
pub async fn accept_loop(
    worker: Rc<Worker>,
    slot: usize,
    listener: AsyncFd<mio::net::TcpListener>,
    limit: usize,
    stop: Rc<StopSignal>,
) {
    let mut resource_log = ResourceLog::default();
    // A listener's protocol is part of its socket settings: changing it rebinds (reload).
    let tcp = {
        let snapshot = worker.snapshot();
        snapshot
            .listener_index(slot)
            .is_some_and(|i| snapshot.config.listeners[i].tcp().is_some())
    };
    loop {
        if !wait_below_limit(&worker, slot, limit, &stop).await {
            return;
        }
        let accepted = tokio::select! {
            r = accept(&listener) => r,
            _ = worker.drained() => return,
            _ = stop.stopped() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                // TCP_NODELAY is inherited from the listening socket (see `bind`).
                let guard = ConnectionGuard::new(worker.clone(), slot);
                let w = worker.clone();
                if tcp {
                    // The L4 relay waits on both sides at once: register straight away.
                    match tokio::net::TcpStream::from_std(stream) {
                        Ok(stream) => {
                            tokio::task::spawn_local(async move {
                                crate::tcp::serve_tcp(w, slot, stream, peer).await;
                                drop(guard);
                            });
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot register a connection"),
                    }
                } else {
                    let stream = ClientStream::new(stream);
                    tokio::task::spawn_local(async move {
                        crate::proxy::serve_client(w, slot, stream, peer).await;
                        drop(guard);
                    });
                }
            }
            Err(e) if is_resource_exhaustion(&e) => {
                count_accept_error(&worker, slot, &e);
                if let Some(suppressed) = resource_log.should_log() {
                    tracing::warn!(error = %e, suppressed, "accept failed: out of resources; pausing accepts, open connections keep being served");
                }
                tokio::select! {
                    _ = tokio::time::sleep(RESOURCE_BACKOFF) => {}
                    _ = worker.drained() => return,
                    _ = stop.stopped() => return,
                }
            }
            Err(e) => {
                count_accept_error(&worker, slot, &e);
                tracing::debug!(error = %e, "accept failed");
            }
        }
    }
}

/// Accepts one connection as a non-blocking socket that is not registered with the reactor
/// (see `client_stream`).
async fn accept(
    listener: &AsyncFd<mio::net::TcpListener>,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    loop {
        // Like tokio's own accept: spend task budget, so a flood of connections cannot keep
        // this loop from yielding to the connections it has accepted. Before the accept, not
        // after: a yield there could let `select!` drop an accepted connection.
        tokio::task::coop::consume_budget().await;
        let mut ready = listener.readable().await?;
        if let Ok(accepted) = ready.try_io(|l| l.get_ref().accept()) {
            let (stream, peer) = accepted?;
            return Ok((std::net::TcpStream::from(OwnedFd::from(stream)), peer));
        }
    }
}

fn count_accept_error(worker: &Worker, slot: usize, e: &io::Error) {
    if let Some(m) = worker.metrics.listener(slot) {
        m.accept_errors[accept_error_index(e)].inc();
    }
}

/// Waits until this worker's share of the listener's connections is below `limit`.
/// Returns false when the worker starts draining or the listener stops instead.
async fn wait_below_limit(worker: &Worker, slot: usize, limit: usize, stop: &StopSignal) -> bool {
    loop {
        if worker.is_draining() || stop.is_stopped() {
            return false;
        }
        let closed = worker.connection_closed.notified();
        if worker.open_on(slot) < limit {
            return true;
        }
        tokio::select! {
            _ = closed => {}
            _ = worker.drained() => return false,
            _ = stop.stopped() => return false,
        }
    }
}
