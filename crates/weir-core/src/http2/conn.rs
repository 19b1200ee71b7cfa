//! One HTTP/2 client connection: the `h2` server with the listener's settings and
//! guards, the accept loop that starts a task per stream, the idle timeout, the
//! rapid-reset budget, and the graceful close on drain.
//!
//! Defences configured on the `h2` crate (docs/http2.md): SETTINGS_MAX_CONCURRENT_STREAMS,
//! SETTINGS_MAX_HEADER_LIST_SIZE (header blocks and CONTINUATION floods are bounded by it),
//! initial windows, the per-stream send buffer, `max_pending_accept_reset_streams` (streams
//! reset before they were accepted) and `max_local_error_reset_streams` (resets forced by a
//! client's errors, MadeYouReset). Weir adds the budget for resets of accepted streams.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::{Builder, Connection};
use h2::Reason;
use tokio::sync::Notify;
use weir_config::{Http2, Listener};

use super::budget::ResetBudget;
use super::io::Prefixed;
use crate::client::ClientConn;
use crate::filters::forwarded::ClientIp;
use crate::tls::session::TlsSession;
use crate::worker::Worker;

/// What a connection's stream tasks share with it.
pub struct Shared {
    pub worker: Rc<Worker>,
    pub slot: usize,
    pub ip: ClientIp,
    /// The peer's address (access lists and rate-limit keys).
    pub peer_ip: std::net::IpAddr,
    /// The connection's TLS session (`None`: h2c), for forwarded headers, `{scheme}` and
    /// the access log.
    pub tls: Option<Box<TlsSession>>,
    budget: ResetBudget,
    /// Stream tasks running.
    active: Cell<usize>,
    /// When the last stream task ended (the idle timeout counts from there).
    idle_since: Cell<Instant>,
    /// Signalled when a stream task ends.
    ended: Notify,
}

impl Shared {
    /// The client reset a stream Weir had accepted (its upstream request was cancelled).
    pub fn reset_by_client(&self) {
        if let Some(m) = self.worker.metrics.listener(self.slot) {
            m.http2.client_resets.inc();
        }
        self.budget.record(Instant::now());
    }

    /// Weir reset a stream because the client sent a malformed request.
    pub fn reset_by_client_error(&self) {
        self.budget.record(Instant::now());
    }
}

/// Counts a running stream task; on drop, records the end.
struct Running(Rc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        let s = &self.0;
        s.active.set(s.active.get() - 1);
        s.idle_since.set(Instant::now());
        s.ended.notify_one();
    }
}

fn builder(h2: &Http2) -> Builder {
    let mut b = Builder::new();
    b.max_concurrent_streams(h2.max_concurrent_streams)
        .max_header_list_size(h2.max_header_list_size)
        .initial_window_size(h2.initial_stream_window)
        .initial_connection_window_size(h2.initial_connection_window)
        .max_send_buffer_size(h2.max_send_buffer as usize)
        .max_pending_accept_reset_streams(h2.max_pending_accept_resets as usize)
        .max_local_error_reset_streams(Some(h2.max_local_error_resets as usize));
    b
}

/// Serves an HTTP/2 connection whose preface is at the start of `conn.buf` or still to be
/// read from `conn.stream` (plain, or TLS after ALPN h2), until it closes. Returns once
/// every stream task has ended.
pub async fn serve(worker: Rc<Worker>, slot: usize, mut conn: ClientConn) {
    let snapshot = worker.snapshot();
    let Some(index) = snapshot.listener_index(slot) else {
        return;
    };
    let listener = &snapshot.config.listeners[index];
    let shared = Rc::new(Shared {
        worker: worker.clone(),
        slot,
        ip: conn.ip,
        peer_ip: conn.peer_ip,
        tls: conn.tls.take(),
        budget: ResetBudget::new(listener.http2.reset_budget, listener.http2.reset_window),
        active: Cell::new(0),
        idle_since: Cell::new(Instant::now()),
        ended: Notify::new(),
    });
    if let Some(m) = worker.metrics.listener(slot) {
        m.http2.connections.inc();
    }
    let handshake = builder(&listener.http2).handshake::<_, Bytes>(Prefixed { conn });
    let h2 = match tokio::time::timeout(listener.header_timeout, handshake).await {
        Ok(Ok(h2)) => h2,
        Ok(Err(e)) => {
            tracing::debug!(listener = %listener.name, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    accept_streams(&shared, h2, listener).await;
    // The connection is closed; stream tasks end as their sends fail.
    while shared.active.get() > 0 {
        shared.ended.notified().await;
    }
}

/// Accepts streams until the connection closes, starting a task for each.
async fn accept_streams(
    shared: &Rc<Shared>,
    mut h2: Connection<Prefixed, Bytes>,
    listener: &Listener,
) {
    let worker = &shared.worker;
    let idle = listener.keepalive_timeout;
    let mut closing = false;
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    loop {
        tokio::select! {
            accepted = h2.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    if worker.snapshot().listener_index(shared.slot).is_none() && !closing {
                        // A reload removed the listener: finish what runs, take nothing new.
                        h2.graceful_shutdown();
                        closing = true;
                    }
                    shared.active.set(shared.active.get() + 1);
                    let running = Running(shared.clone());
                    tokio::task::spawn_local(async move {
                        let shared = running.0.clone();
                        super::stream::serve(shared, request, respond).await;
                        drop(running);
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(listener = %listener.name, error = %e, "HTTP/2 connection error");
                    // h2's own guards (resets before accept, resets forced by client errors).
                    let calm = e.reason() == Some(Reason::ENHANCE_YOUR_CALM) && !e.is_remote();
                    if calm && !shared.budget.is_exceeded() {
                        count_calm(shared);
                    }
                    return;
                }
                None => return,
            },
            () = shared.budget.notify.notified(), if !closing => {
                if shared.budget.is_exceeded() {
                    tracing::debug!(listener = %listener.name, "HTTP/2 client over its reset budget");
                    count_calm(shared);
                    h2.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                    closing = true;
                }
            }
            () = &mut timer, if !closing => {
                let since = shared.idle_since.get();
                let idle_out = shared.active.get() == 0 && since.elapsed() >= idle;
                // Also a busy connection notices a reload that removed its listener here,
                // within keepalive_timeout.
                let removed = worker.snapshot().listener_index(shared.slot).is_none();
                if idle_out || removed {
                    h2.graceful_shutdown();
                    closing = true;
                } else {
                    // While streams run, look again in a while (at least a second, so a
                    // keepalive_timeout of 0 does not spin).
                    let next = match shared.active.get() {
                        0 => since + idle,
                        _ => Instant::now() + idle.max(Duration::from_secs(1)),
                    };
                    timer.as_mut().reset(next.into());
                }
            }
            () = worker.drained(), if !closing => {
                // Drain: GOAWAY, in-flight streams finish, no new ones start.
                h2.graceful_shutdown();
                closing = true;
            }
        }
    }
}

fn count_calm(shared: &Shared) {
    if let Some(m) = shared.worker.metrics.listener(shared.slot) {
        m.http2.calm_goaways.inc();
    }
}
