//! The HTTP/1.x client adapter: one client connection, request after request.
//!
//! `serve_client` runs the phases of docs/request-lifecycle.md in order: `open` (the
//! connection, its PROXY header, its TLS handshake), `Serving::current` (which snapshot a
//! request runs on), `ClientConn::next_request` (read), `serve` (identify, then `handle`:
//! the routing decision and what it says), `answer` (a failure nothing was sent for yet
//! becomes Weir's answer) and `record` (metrics and the access log).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use weir_config::Listener;

use super::forward::{forward, forward_filling};
use super::route::{Decision, Routing};
use super::{record, ClientSide, Done, Handled};
use crate::answer::Answer;
use crate::client::{ClientConn, NextRequest};
use crate::client_stream::ClientStream;
use crate::codec::http1::write::Persistence;
use crate::codec::http1::{RequestHead, ResponseHead};
use crate::error::{ProxyError, Side};
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::forward::body::BodyState;
use crate::forward::{Failure, Reached};
use crate::listener::proxy_protocol::accept_step;
use crate::listener::BindSlot;
use crate::metrics::shard::{method_index, Protocol, METHODS};
use crate::otel::RequestTrace;
use crate::snapshot::Snapshot;
use crate::worker::Worker;

/// Serves one client connection that came on the listener bind `bind` until it closes.
///
/// The listener's config position is looked up in each request's snapshot: a reload may
/// move it, and once a reload removes it the connection serves the request it has and
/// closes.
pub async fn serve_client(
    worker: Rc<Worker>,
    bind: BindSlot,
    stream: ClientStream,
    peer: SocketAddr,
) {
    let slot = bind.slot;
    // Boxed like the HTTP/2 takeover (and the request handling below, out of line): the
    // TLS handshake and HTTP/2 state are large and must not stay in every idle task.
    let Some((mut conn, mut kept)) = Box::pin(open(&worker, bind, stream, peer)).await else {
        return;
    };
    if conn.tls.as_ref().is_some_and(|t| t.h2) {
        // ALPN settled on h2: the client's first bytes are the preface.
        return Box::pin(crate::http2::serve(worker, slot, conn)).await;
    }
    let mut req = RequestHead::default();
    let mut resp = ResponseHead::default();
    loop {
        // The wait for the next request runs under the current config's timeouts.
        let Some(waiting) = kept.current(&worker, slot, &mut conn) else {
            return;
        };
        let counters = Counters {
            bytes_in: conn.buf.consumed_total(),
            bytes_out: conn.sent,
        };
        let next = conn
            .next_request(waiting.listener(), &mut req, &worker)
            .await;
        if matches!(next, Ok(NextRequest::Http2)) {
            return Box::pin(crate::http2::serve(worker, slot, conn)).await;
        }
        // `req` describes this request (else it is the previous one's head).
        let parsed = matches!(next, Ok(NextRequest::Ready));
        // The request runs on the snapshot current when its head arrived, not the one from
        // before an idle wait: a reload in between applies to it.
        let Some(serving) = waiting.current(&worker, slot, &mut conn) else {
            return;
        };
        let started = Instant::now();
        conn.current.begin(started);
        // Out of line: handling a request (routing, forwarding, filters) is most of this
        // task's state. Inline, every connection would carry it while idle too (about 6 KiB
        // of a 7 KiB task); placed in a block the worker reuses (a box would be allocated
        // and freed per request), an idle connection holds only what waiting needs.
        let handling = crate::frame::place(&worker.frames, || {
            serve(&worker, slot, &serving, &mut conn, next, &req, &mut resp)
        });
        let Some((handled, method)) = handling.await else {
            return;
        };
        let listener = serving.listener();
        let req = parsed.then_some(&req);
        let answered = answer(&worker, &mut conn, &handled, listener, req, &resp);
        let (status, keep_alive) = answered.await;
        let finished = Instant::now();
        // The keep-alive wait for the next request counts from here.
        conn.idle_since = finished;
        let done = Done {
            listener: serving.index,
            slot,
            method,
            protocol: Protocol::Http1,
            status,
            duration: finished.saturating_duration_since(started),
        };
        let trace = conn.trace.take();
        let side = counters.side(&conn, trace.as_deref());
        record(&worker, &serving.snapshot, &side, &handled, &done);
        if !keep_alive {
            return;
        }
        kept = serving;
    }
}

/// Byte counters of the client connection when a request started.
struct Counters {
    bytes_in: u64,
    bytes_out: u64,
}

impl Counters {
    /// What `record` needs of `conn` for the request started at these counts, with its
    /// `trace` (taken from the connection).
    fn side<'a>(&self, conn: &'a ClientConn, trace: Option<&'a RequestTrace>) -> ClientSide<'a> {
        ClientSide {
            // The client behind trusted proxies when there is one (the log shows it).
            ip: conn.client_text(),
            fields: &conn.current.log_fields,
            bytes_in: conn.buf.consumed_total() - self.bytes_in,
            bytes_out: conn.sent - self.bytes_out,
            tls: conn.tls.as_deref(),
            request_id: conn.current.request_id.as_bytes(),
            exchange: &conn.current.exchange,
            trace,
        }
    }
}

/// The snapshot a request is served with, and its listener's config position in it.
struct Serving {
    #[allow(clippy::redundant_allocation)]
    snapshot: Rc<Arc<Snapshot>>,
    index: usize,
}

impl Serving {
    /// The worker's current snapshot if it still has the listener of `slot`. If a reload
    /// removed the listener, the connection still gets its next request answered, on the
    /// snapshot it was served with (`self`), with `Connection: close`; if it changed
    /// the client-auth policy the connection's handshake met, `None`: the connection
    /// closes unanswered (`Snapshot::admits`). Inlined (twice per request), with the rare
    /// reload out of line.
    #[inline]
    fn current(self, worker: &Worker, slot: usize, conn: &mut ClientConn) -> Option<Serving> {
        if worker.is_current(&self.snapshot) {
            return Some(self);
        }
        self.reloaded(worker, slot, conn)
    }

    /// [`Serving::current`] after a reload.
    #[inline(never)]
    fn reloaded(self, worker: &Worker, slot: usize, conn: &mut ClientConn) -> Option<Serving> {
        let fresh = worker.snapshot();
        match fresh.listener_index(slot) {
            Some(index) if fresh.admits(index, conn.tls.as_deref()) => Some(Serving {
                snapshot: fresh,
                index,
            }),
            Some(_) => None,
            None => {
                conn.last_request = true;
                Some(self)
            }
        }
    }

    fn listener(&self) -> &Listener {
        &self.snapshot.config.listeners[self.index]
    }
}

/// Connection setup: the client connection of the listener bind `bind`, after its
/// PROXY header when the listener expects one. `None`: close (the listener is gone, or the
/// PROXY header was missing or bad).
async fn open(
    worker: &Rc<Worker>,
    bind: BindSlot,
    stream: ClientStream,
    peer: SocketAddr,
) -> Option<(ClientConn, Serving)> {
    let BindSlot { slot, plain_http } = bind;
    let snapshot = worker.snapshot();
    let index = snapshot.listener_index(slot)?;
    let listener = &snapshot.config.listeners[index];
    let mut conn = ClientConn::new(worker.clone(), slot, stream, peer, listener);
    let at = crate::listener::Slot { slot, listener };
    if listener.proxy_protocol.accept {
        let stream = conn.stream.registered().ok()?;
        let timeout = listener.header_timeout;
        let step = accept_step(worker, at, stream, peer, &mut conn.buf, timeout);
        // The carried client address is the one X-Forwarded-For and logs show.
        if let Some(addresses) = step.await.ok()? {
            let source = addresses.source.ip().to_canonical();
            conn.ip = ClientIp::new(source);
            conn.peer_ip = source;
        }
        // The first request gets its whole header_timeout after the PROXY header.
        conn.idle_since = Instant::now();
    }
    // TLS listeners: the handshake, before the first request (see tls/handshake.rs); not
    // on their plain-HTTP binds.
    let tls = snapshot.listeners[index]
        .tls
        .as_ref()
        .filter(|_| !plain_http);
    if let Some(tls) = tls {
        let hello = crate::tls::handshake::accept(worker, at, tls, &mut conn.stream, &mut conn.buf);
        conn.tls = Some(Box::new(hello.await?));
        // The first request gets its whole header_timeout after the handshake.
        conn.idle_since = Instant::now();
    }
    Some((conn, Serving { snapshot, index }))
}

/// What reading produced, handled: the request routed and forwarded (or answered), or the
/// read error as a failure to answer. `None`: the connection closes quietly. Also returns
/// the request's method slot for the metrics.
async fn serve(
    worker: &Worker,
    slot: usize,
    serving: &Serving,
    conn: &mut ClientConn,
    next: Result<NextRequest, ProxyError>,
    req: &RequestHead,
    resp: &mut ResponseHead,
) -> Option<(Handled, usize)> {
    match next {
        Ok(NextRequest::Ready) => {
            conn.served += 1;
            let (buf, listener) = (conn.buf.filled(), serving.listener());
            let id = &mut conn.current.request_id;
            conn.current.real_client =
                crate::policy::identify(worker, listener, buf, req, conn.peer_ip, id);
            if worker.log(slot).is_some() {
                conn.current.log_fields.capture(conn.buf.filled(), req);
            }
            let method = method_index(&conn.buf.filled()[req.method.clone()]);
            let handled = handle(worker, serving, conn, req, resp).await;
            Some((handled, method))
        }
        Ok(NextRequest::Close | NextRequest::Http2) => None,
        Err(error) => {
            // Nothing of the previous request's (id, client behind trusted proxies) is
            // left: `Current::begin` emptied it.
            let handled = Handled {
                route: None,
                local: false,
                result: Err(error.into()),
            };
            Some((handled, METHODS.len() - 1))
        }
    }
}

/// Answers a failure the client has not had a response for yet (`Answer::Error`, best
/// effort: the client may be gone). `req`: the request's head, if one was read. Returns the
/// status the request counts with (the one sent to the client, also when the response was
/// cut short after its head; 499 when the client left before it could be answered) and
/// whether the connection stays open.
async fn answer(
    worker: &Worker,
    conn: &mut ClientConn,
    handled: &Handled,
    listener: &Listener,
    req: Option<&RequestHead>,
    resp: &ResponseHead,
) -> (u16, bool) {
    // The status a request handled (if `Reached::Head`, in part) was answered with.
    let sent = match handled.route.is_some() || handled.local {
        true => resp.status,
        false => listener.default_response.status,
    };
    let failure = match &handled.result {
        Ok(keep_alive) => return (sent, *keep_alive),
        Err(failure) => failure,
    };
    super::log_failure(failure, listener, &conn.ip);
    if failure.reached == Reached::Head {
        return (sent, false);
    }
    // The connection carries on, as nginx's does, only after an upstream failure or no
    // server (502, 503, 504; a client's error closes), when the whole request had been read
    // (a body still arriving, or one an upload left half-read, is not read to its end to
    // save the connection), and when the request's own keep-alive rules allow it.
    let keep_alive = failure.error.side() != Side::Client
        && conn.current.read
        && req.is_some_and(|req| wants_keep_alive(worker, conn, req, listener));
    let Some(status) = failure.error.status() else {
        return (499, keep_alive);
    };
    let persistence = Persistence::of(keep_alive, req.is_some_and(|r| r.minor_version == 0));
    let is_head = req.is_some_and(|r| r.is_head);
    let mut out = std::mem::take(&mut conn.out);
    let answer = Answer::Error(failure.error);
    let bytes = answer.render(&mut out, persistence, is_head, &Vars::default());
    let _ = conn.write_all(bytes, listener).await;
    conn.out = out;
    (status, keep_alive)
}

/// One request: the routing decision, then what it says (forward, answer, refuse).
async fn handle(
    worker: &Worker,
    serving: &Serving,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
) -> Handled {
    let routing = Routing {
        worker,
        snapshot: &serving.snapshot,
        listener: serving.index,
    };
    let listener = routing.listener();
    let keep_alive = wants_keep_alive(worker, conn, req, listener);
    let mut path = std::mem::take(&mut conn.path);
    let (route, decided) = routing.decide(&conn.request(req), &mut path);
    let decision = match decided {
        Ok(decision) => decision,
        Err(check) => Box::pin(routing.verified(&conn.request(req), &path, check)).await,
    };
    conn.path = path;
    if let Some(trace) = routing.trace(route, || conn.request(req)) {
        conn.trace = Some(trace);
    }
    let (local, result) = match decision {
        Decision::Forward(target, None) => (
            false,
            forward(worker, &target, conn, req, resp, keep_alive).await,
        ),
        Decision::Forward(target, Some(fill)) => {
            // Boxed: a route without `cache` keeps the request's state as small as before.
            let filling = forward_filling(worker, target, conn, req, resp, keep_alive, fill);
            (false, Box::pin(filling).await)
        }
        Decision::Answer(answer) => {
            let answered = local_response(listener, conn, req, keep_alive, &answer, resp);
            (answer.is_local(), answered.await)
        }
        Decision::Reply(reply) => {
            let under = crate::files::Under::of(listener, route);
            // Boxed: a reply's sending is not part of every request's state.
            let sent = crate::files::respond_http1(conn, req, under, *reply, keep_alive, resp);
            (true, Box::pin(sent).await)
        }
        Decision::Refuse(error) => (false, Err(error.into())),
    };
    Handled {
        route,
        local,
        result,
    }
}

/// Whether the client connection may carry another request after this one.
#[inline]
fn wants_keep_alive(
    worker: &Worker,
    conn: &ClientConn,
    req: &RequestHead,
    listener: &Listener,
) -> bool {
    // An HTTP/1.0 client keeps the connection only when it asks to.
    let asked = !req.connection.close && (req.minor_version != 0 || req.connection.keep_alive);
    let (limit, served) = (listener.keepalive_requests, conn.served);
    let closing = worker.is_draining() || conn.last_request;
    asked && (limit == 0 || served < limit) && !closing && !listener.keepalive_timeout.is_zero()
}

/// Answers the request with `answer`, keeping the connection exactly as a forwarded request
/// would: a request body already in the buffer is skipped, one still arriving closes the
/// connection; an HTTP/1.0 keep-alive client is told the connection stays open; a HEAD
/// request gets no body. `resp.status` is set to the status sent.
async fn local_response(
    listener: &Listener,
    conn: &mut ClientConn,
    req: &RequestHead,
    keep_alive: bool,
    answer: &Answer<'_>,
    resp: &mut ResponseHead,
) -> Result<bool, Failure> {
    let mut body = BodyState::new(req.framing, false, listener.max_body_size);
    let (_, consumed) = body
        .take(&mut conn.buf.filled_mut()[req.head_len..])
        .map_err(|_| ProxyError::BadRequest("malformed body"))?;
    let keep_alive = keep_alive && body.is_done();
    let persistence = Persistence::of(keep_alive, req.minor_version == 0);
    let mut out = std::mem::take(&mut conn.out);
    resp.status = answer.status();
    let request = conn.request(req);
    let vars = answer.vars(&request, &conn.path);
    let bytes = answer.render(&mut out, persistence, req.is_head, &vars);
    conn.buf.consume(req.head_len + consumed);
    let written = conn.write_all(bytes, listener).await;
    conn.out = out;
    written.map_err(Failure::after_head)?;
    Ok(keep_alive)
}

#[cfg(test)]
mod task_size {
    fn future_size<A, B, C, D, F: std::future::Future>(_: impl Fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every open connection's task is allocated at this size for its whole life, idle or
    /// not: handling a request is out of line (`frame::place`) so that 10,000 idle keep-alive connections do not
    /// each carry the state of a request in flight (it was 6,968 bytes inline).
    #[test]
    fn an_idle_connection_task_stays_small() {
        let size = future_size(super::serve_client);
        assert!(size <= 2048, "serve_client's future is {size} bytes");
    }

    /// The request's future, placed in a worker's block once per request: what a route's
    /// features add inline here (the cache's miss is boxed in `forward_filling`) every
    /// request writes, and every block in flight holds.
    #[test]
    fn a_request_future_stays_small() {
        fn size<A, B, C, D, E, G, H, F: std::future::Future>(
            _: impl Fn(A, B, C, D, E, G, H) -> F,
        ) -> usize {
            std::mem::size_of::<F>()
        }
        let size = size(super::serve);
        assert!(size < 7168, "serve's future is {size} bytes");
    }
}
