//! One HTTP/2 client connection: the `h2` server with the listener's settings and
//! guards, the accept loop that starts a task per stream, the idle timeout, the
//! rapid-reset budget, and the graceful close on drain.
//!
//! Defences configured on the `h2` crate (docs/http2.md): SETTINGS_MAX_CONCURRENT_STREAMS,
//! SETTINGS_MAX_HEADER_LIST_SIZE (header blocks and CONTINUATION floods are bounded by it),
//! initial windows, the per-stream send buffer, `max_pending_accept_reset_streams` (streams
//! reset before they were accepted) and `max_local_error_reset_streams` (resets forced by a
//! client's errors, MadeYouReset). Weir adds, per connection: the reset budget (resets of
//! accepted streams, and every reset a client's error forces), the glitch budget (frames
//! that carry no request), both watched in `io`, and the stall reaper (writes that make no
//! progress for `stall_timeout`: the connection is dropped, GOAWAY or not), and the bound on
//! the response bytes all its streams together leave with the `h2` crate (`outbox`).
//!
//! While no stream runs (before the first, and whenever the last ends) the connection's
//! seat among its worker's idle connections (`places`, taken over from its `ClientConn`)
//! rests: at the listener's `max_connections` a newcomer may take its place
//! (`listener::reclaim`), and the connection closes with GOAWAY NO_ERROR. A stream
//! starting makes it busy again.

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::{Builder, Connection};
use h2::Reason;
use tokio::sync::Notify;
use weir_config::Listener;

use super::budget::Budget;
use super::io::Prefixed;
use super::outbox::{Outbox, StreamOut};
use crate::client::ClientConn;
use crate::filters::forwarded::ClientIp;
use crate::metrics::shard::{Counter, Http2Metrics};
use crate::places::IdlePlace;
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
    budget: Budget,
    glitches: Budget,
    /// Since when a write to the client waits (`None`: the last write went through).
    pub stalled_since: Cell<Option<Instant>>,
    /// Signalled when a write starts to wait.
    pub stalled: Notify,
    /// Stream tasks running.
    active: Cell<usize>,
    /// When the last stream task ended (the idle timeout counts from there).
    idle_since: Cell<Instant>,
    /// Signalled when a stream task ends.
    ended: Notify,
    /// REFUSED_STREAM resets Weir chose to send (a reload removed the listener) and not
    /// yet seen written: no client error, so not for the reset budget.
    own_refusals: Cell<u32>,
    /// RFC 8441 tunnels running, against `http2.max_tunnels` (`stream::TunnelSeat`).
    pub tunnels: Cell<u32>,
    /// The connection's seat among the worker's idle connections (taken over from its
    /// `ClientConn`), resting while no stream runs.
    idle: IdlePlace,
    /// Response DATA handed to the `h2` crate and not yet written, against
    /// `max_connection_send_buffer`.
    pub outbox: Outbox,
}

impl Shared {
    /// The client reset a stream Weir had accepted (its upstream request was cancelled).
    pub fn reset_by_client(&self) {
        self.count(|m| &m.client_resets);
        self.budget.record(Instant::now());
    }

    /// Weir refuses a stream of its own accord: the REFUSED_STREAM it writes next is no
    /// client's error.
    pub fn refuse(&self, respond: &mut h2::server::SendResponse<Bytes>) {
        self.own_refusals.set(self.own_refusals.get() + 1);
        respond.send_reset(Reason::REFUSED_STREAM);
    }

    /// An RST_STREAM with error `code` was written: Weir (or the `h2` crate) reset a stream
    /// because of the client's error on it, unless it is one of Weir's own refusals.
    pub fn reset_written(&self, code: Option<u32>) {
        let refused = u32::from(Reason::REFUSED_STREAM);
        if code == Some(refused) && self.own_refusals.get() > 0 {
            self.own_refusals.set(self.own_refusals.get() - 1);
            return;
        }
        self.count(|m| &m.forced_resets);
        self.budget.record(Instant::now());
    }

    /// The client sent a frame that carries no request (`frames::glitch`).
    pub fn glitch(&self) {
        self.count(|m| &m.glitches);
        self.glitches.record(Instant::now());
    }

    fn over_budget(&self) -> bool {
        self.budget.is_exceeded() || self.glitches.is_exceeded()
    }

    /// Counts one in the listener's HTTP/2 metric `metric`.
    fn count(&self, metric: impl FnOnce(&Http2Metrics) -> &Counter) {
        if let Some(m) = self.worker.metrics.listener(self.slot) {
            metric(&m.http2).inc();
        }
    }
}

/// Counts a running stream task; on drop, records the end (at `ended`, the time the
/// stream read last, when it finished; now when its task was dropped unfinished).
struct Running {
    shared: Rc<Shared>,
    ended: Option<Instant>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let s = &self.shared;
        s.active.set(s.active.get() - 1);
        let ended = self.ended.unwrap_or_else(Instant::now);
        s.idle_since.set(ended);
        if s.active.get() == 0 {
            s.idle.rest(&s.worker.idle, ended);
        }
        s.ended.notify_one();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.idle.close(&self.worker.idle);
    }
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
    let h2 = &listener.http2;
    let now = Instant::now();
    let shared = Rc::new(Shared {
        worker: worker.clone(),
        slot,
        ip: conn.ip,
        peer_ip: conn.peer_ip,
        tls: conn.tls.take(),
        budget: Budget::new(h2.reset_budget, h2.reset_window),
        glitches: Budget::new(h2.glitch_budget, h2.glitch_window),
        stalled_since: Cell::new(None),
        stalled: Notify::new(),
        active: Cell::new(0),
        idle_since: Cell::new(now),
        ended: Notify::new(),
        own_refusals: Cell::new(0),
        tunnels: Cell::new(0),
        idle: std::mem::take(&mut conn.idle),
        outbox: Outbox::new(h2.max_connection_send_buffer),
    });
    // Idle until its first stream: a connection that never sends one can be reclaimed.
    shared.idle.rest(&worker.idle, now);
    shared.count(|m| &m.connections);
    let io = Prefixed::new(conn, shared.clone());
    let handshake = Builder::new()
        .max_concurrent_streams(h2.max_concurrent_streams)
        .max_header_list_size(h2.max_header_list_size)
        .initial_window_size(h2.initial_stream_window)
        .initial_connection_window_size(h2.initial_connection_window)
        .max_send_buffer_size(h2.max_send_buffer as usize)
        .max_pending_accept_reset_streams(h2.max_pending_accept_resets as usize)
        .max_local_error_reset_streams(Some(h2.max_local_error_resets as usize))
        // SETTINGS_ENABLE_CONNECT_PROTOCOL: WebSocket over HTTP/2 (RFC 8441, `websocket`).
        .enable_connect_protocol()
        .handshake::<_, Bytes>(io);
    let handshake = tokio::select! {
        biased;
        done = tokio::time::timeout(listener.header_timeout, handshake) => done,
        // Its place was taken before the SETTINGS exchange ended: no GOAWAY to send yet.
        () = poll_fn(|cx| shared.idle.poll_taken(&worker.idle, cx)) => return,
    };
    let h2 = match handshake {
        Ok(Ok(h2)) => h2,
        Ok(Err(e)) => {
            tracing::debug!(listener = %listener.name, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    accept_streams(&shared, h2, listener).await;
    shared.idle.close(&worker.idle);
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
    let mut stall = listener.http2.stall_timeout;
    let mut closing = false;
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    // Armed while a write waits: the connection is dropped once it waited `stall`.
    let stall_timer = tokio::time::sleep(stall);
    tokio::pin!(stall_timer);
    let mut stall_armed = false;
    // The signals are waited on across turns of the loop, each renewed only when it fired:
    // made anew every turn (once per accepted stream, at least), each registered with its
    // `Notify` and left it again, under the `Notify`'s lock (about 0.3k instructions per
    // stream for the four).
    let budget = shared.budget.notify.notified();
    let glitches = shared.glitches.notify.notified();
    let stalled = shared.stalled.notified();
    let drained = worker.drained();
    tokio::pin!(budget, glitches, stalled, drained);
    loop {
        if closing {
            // A closing connection is no newcomer's to take (its streams are finishing).
            shared.idle.close(&worker.idle);
        }
        tokio::select! {
            accepted = h2.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    closing |= take_stream(shared, &mut h2, closing);
                    spawn_stream(shared, request, respond);
                }
                Some(Err(e)) => return connection_failed(shared, listener, &e),
                None => return,
            },
            () = &mut budget, if !closing => {
                budget.set(shared.budget.notify.notified());
                closing = calm_down(shared, &mut h2, listener, "reset");
            }
            () = &mut glitches, if !closing => {
                glitches.set(shared.glitches.notify.notified());
                closing = calm_down(shared, &mut h2, listener, "glitch");
            }
            () = &mut stalled => {
                stalled.set(shared.stalled.notified());
                if let Some(since) = shared.stalled_since.get() {
                    stall_timer.as_mut().reset((since + stall).into());
                    stall_armed = true;
                }
            }
            () = &mut stall_timer, if stall_armed => match shared.stalled_since.get() {
                Some(since) if since.elapsed() >= stall => return stalled_out(shared, listener),
                Some(since) => stall_timer.as_mut().reset((since + stall).into()),
                None => stall_armed = false,
            },
            () = &mut timer, if !closing => {
                closing = idle_check(shared, &mut h2, idle, timer.as_mut());
            }
            // At max_connections a newcomer took this idle connection's place: GOAWAY
            // NO_ERROR (no stream runs); dropped at once when a write already waits: a
            // client that does not read is not waited for (later writes get no stall time).
            () = poll_fn(|cx| shared.idle.poll_taken(&worker.idle, cx)), if !closing => {
                h2.abrupt_shutdown(Reason::NO_ERROR);
                if shared.stalled_since.get().is_some() {
                    return;
                }
                (closing, stall) = (true, Duration::ZERO);
            }
            () = &mut drained, if !closing => {
                // Drain: GOAWAY, in-flight streams finish, no new ones start.
                h2.graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Marks the connection busy with a newly accepted stream; whether it closes after this
/// one (GOAWAY sent): its idle place was taken just as the stream came (served, then the
/// connection closes), or a reload removed the listener. Finish what runs, take nothing
/// new.
#[inline]
fn take_stream(shared: &Shared, h2: &mut Connection<Prefixed, Bytes>, closing: bool) -> bool {
    let worker = &shared.worker;
    let taken = !shared.idle.busy(&worker.idle);
    let tls = shared.tls.as_deref();
    if (taken || worker.snapshot().serving_index(shared.slot, tls).is_none()) && !closing {
        h2.graceful_shutdown();
        return true;
    }
    false
}

/// The connection failed (`e`); counted when it was one of h2's own guards (resets before
/// accept, resets forced by client errors) that closed it.
fn connection_failed(shared: &Shared, listener: &Listener, e: &h2::Error) {
    tracing::debug!(listener = %listener.name, error = %e, "HTTP/2 connection error");
    let calm = e.reason() == Some(Reason::ENHANCE_YOUR_CALM) && !e.is_remote();
    if calm && !shared.over_budget() {
        shared.count(|m| &m.calm_goaways);
    }
}

/// The client reads nothing, not even a GOAWAY, for `stall_timeout`: the connection is
/// dropped (counted).
fn stalled_out(shared: &Shared, listener: &Listener) {
    tracing::debug!(listener = %listener.name, "HTTP/2 client stalled: closed");
    shared.count(|m| &m.stalled);
}

/// Starts the task that serves one accepted stream.
fn spawn_stream(
    shared: &Rc<Shared>,
    request: http::Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
) {
    shared.active.set(shared.active.get() + 1);
    let mut running = Running {
        shared: shared.clone(),
        ended: None,
    };
    // Its hand-offs of response DATA are counted against the connection's bound.
    let id = respond.stream_id().as_u32();
    let serve = super::stream::serve(shared.clone(), request, respond);
    // The stream's future is large (every await of an exchange is in it): boxed once here,
    // the task that is spawned (and copied into place) is small.
    let serve = Box::pin(StreamOut::scope(shared.clone(), id, serve));
    tokio::task::spawn_local(async move {
        running.ended = Some(serve.await);
        drop(running);
    });
}

/// A budget said it was exceeded: GOAWAY ENHANCE_YOUR_CALM. Returns whether the
/// connection is now closing.
fn calm_down(
    shared: &Shared,
    h2: &mut Connection<Prefixed, Bytes>,
    listener: &Listener,
    what: &str,
) -> bool {
    if !shared.over_budget() {
        return false;
    }
    tracing::debug!(listener = %listener.name, budget = what, "HTTP/2 client over its budget");
    shared.count(|m| &m.calm_goaways);
    h2.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
    true
}

/// The idle timer fired: GOAWAY when the connection has been idle for `idle` (or its
/// listener was removed), else the timer is set again. Returns whether it is closing.
fn idle_check(
    shared: &Shared,
    h2: &mut Connection<Prefixed, Bytes>,
    idle: Duration,
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
) -> bool {
    let next = next_idle_look(shared.idle_since.get(), shared.active.get(), idle);
    // Also a busy connection notices a reload that removed its listener (or shut it out
    // by a new client-auth policy) here, within keepalive_timeout.
    let removed = shared
        .worker
        .snapshot()
        .serving_index(shared.slot, shared.tls.as_deref())
        .is_none();
    match next {
        Some(next) if !removed => {
            timer.reset(next.into());
            false
        }
        _ => {
            h2.graceful_shutdown();
            true
        }
    }
}

/// When a connection's idle timer should look again, `running` streams (or requests)
/// under way and the last ended at `since`; `None`: it has been idle for `idle`, it is to
/// close. While some run, it looks again in a while (at least a second, so a
/// `keepalive_timeout` of 0 does not spin). Shared by HTTP/2 and HTTP/3.
pub(crate) fn next_idle_look(since: Instant, running: usize, idle: Duration) -> Option<Instant> {
    match running {
        0 if since.elapsed() >= idle => None,
        0 => Some(since + idle),
        _ => Some(Instant::now() + idle.max(Duration::from_secs(1))),
    }
}
