//! THE pipeline: one client connection, request after request.
//!
//! ```text
//! accept (listener/) -> read request head (client.rs, codec/http1) -> route (router/)
//!   -> pick server (upstream/) -> connect or reuse (connector/) -> send head + stream body
//!   -> read response head -> response filters -> stream body back (forward/)
//!   -> metrics -> keep-alive or close
//! ```
//! `serve_client` runs the phases of docs/request-lifecycle.md in order: `open` (the
//! connection, its PROXY header), `Serving::current` (which snapshot a request runs on),
//! `ClientConn::next_request` (read), `serve` (route and handle), `answer` (errors become
//! responses here, in exactly one place) and `record` (metrics and the access log).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use weir_config::{Listener, Redirect};

use crate::access_log::{Outcome, RequestFields};
use crate::client::{ClientConn, NextRequest};
use crate::client_stream::ClientStream;
use crate::codec::http1::write::Persistence;
use crate::codec::http1::{BodyFraming, RequestHead, ResponseHead};
use crate::error::{ProxyError, Side};
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::filters::redirect::push_redirect;
use crate::filters::respond::Canned;
use crate::filters::rewrite::check_join;
use crate::forward::body::BodyState;
use crate::forward::{forward, Failure, Reached};
use crate::listener::proxy_protocol::accept_step;
use crate::metrics::shard::{method_index, Protocol, METHODS};
use crate::metrics::{AbortReason, DefaultReason};
use crate::router::RequestView;
use crate::snapshot::{RoutePlan, Snapshot};
use crate::worker::Worker;

/// Serves one client connection of the listener with metric slot `slot` until it closes;
/// `plain_http`: it came on a plain-HTTP bind (`http_bind`) of a TLS listener.
///
/// The listener's config position is looked up in each request's snapshot: a reload may
/// move it, and once a reload removes it the connection serves the request it has and
/// closes.
pub async fn serve_client(
    worker: Rc<Worker>,
    (slot, plain_http): (usize, bool),
    stream: ClientStream,
    peer: SocketAddr,
) {
    // Boxed, like the request handling below and the HTTP/2 takeover: the TLS handshake
    // and HTTP/2 state are large and must not stay in every idle connection's task.
    let opening = open(&worker, (slot, plain_http), stream, peer);
    let Some((mut conn, mut kept)) = Box::pin(opening).await else {
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
        let waiting = Serving::current(&worker, slot, kept, &mut conn);
        let counters = Counters {
            bytes_in: conn.buf.consumed_total(),
            bytes_out: conn.sent,
        };
        conn.upstream_pick = None;
        conn.upstream_time = None;
        conn.compressed = None;
        conn.request_read = false;
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
        let serving = Serving::current(&worker, slot, waiting, &mut conn);
        let started = Instant::now();
        conn.request_started = started;
        // Boxed: handling a request (routing, forwarding, filters) is most of this task's
        // state. Inline, every connection would carry it while idle too (about 6 KiB of a
        // 7 KiB task); boxed, an idle connection holds only what waiting needs.
        let handling = Box::pin(serve(
            &worker, slot, &serving, &mut conn, next, &req, &mut resp,
        ));
        let Some((handled, method)) = handling.await else {
            return;
        };
        let listener = serving.listener();
        let request = (listener, parsed.then_some(&req));
        let (status, keep_alive) = answer(&worker, &mut conn, &handled, request, &resp).await;
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
            counters,
        };
        record(
            &worker,
            &serving.snapshot,
            &ClientSide::of(&conn),
            &handled,
            &done,
        );
        if !keep_alive {
            return;
        }
        kept = serving;
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
    /// snapshot it was served with (`previous`), with `Connection: close`.
    fn current(worker: &Worker, slot: usize, previous: Serving, conn: &mut ClientConn) -> Serving {
        let fresh = worker.snapshot();
        match fresh.listener_index(slot) {
            Some(index) => Serving {
                snapshot: fresh,
                index,
            },
            None => {
                conn.last_request = true;
                previous
            }
        }
    }

    fn listener(&self) -> &Listener {
        &self.snapshot.config.listeners[self.index]
    }
}

/// Connection setup: the client connection of the listener with slot `slot`, after its
/// PROXY header when the listener expects one. `None`: close (the listener is gone, or the
/// PROXY header was missing or bad).
async fn open(
    worker: &Rc<Worker>,
    (slot, plain_http): (usize, bool),
    stream: ClientStream,
    peer: SocketAddr,
) -> Option<(ClientConn, Serving)> {
    let snapshot = worker.snapshot();
    let index = snapshot.listener_index(slot)?;
    let listener = &snapshot.config.listeners[index];
    let mut conn = ClientConn::new(worker.clone(), slot, stream, peer, listener);
    if listener.proxy_protocol.accept {
        let stream = conn.stream.registered().ok()?;
        let timeout = listener.header_timeout;
        let step = accept_step(
            worker,
            slot,
            listener,
            (stream, peer),
            &mut conn.buf,
            timeout,
        );
        // The carried client address is the one X-Forwarded-For and logs show.
        if let Some(addresses) = step.await.ok()? {
            conn.ip = ClientIp::new(addresses.source.ip());
            conn.peer_ip = addresses.source.ip();
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
        let at = (slot, listener);
        let hello = crate::tls::handshake::accept(worker, at, tls, &mut conn.stream, &mut conn.buf);
        conn.tls = Some(Box::new(hello.await?));
        // The first request gets its whole header_timeout after the handshake.
        conn.idle_since = Instant::now();
    }
    Some((conn, Serving { snapshot, index }))
}

/// What reading produced, handled: the request routed and forwarded (or answered with the
/// default response), or the read error as a failure to answer. `None`: the connection
/// closes quietly. Also returns the request's method slot for the metrics.
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
            crate::policy::identify(worker, serving.listener(), conn, req);
            if worker.log(slot).is_some() {
                conn.capture_log_fields(req);
            }
            let method = method_index(&conn.buf.filled()[req.method.clone()]);
            let handled = handle(worker, &serving.snapshot, serving.index, conn, req, resp).await;
            Some((handled, method))
        }
        Ok(NextRequest::Close | NextRequest::Http2) => None,
        Err(error) => {
            conn.log_fields = RequestFields::default();
            // Not the previous request's id or client behind trusted proxies.
            conn.request_id.clear();
            conn.real_client = None;
            let handled = Handled {
                route: None,
                local: false,
                result: Err(error.into()),
            };
            Some((handled, METHODS.len() - 1))
        }
    }
}

/// Answers a failure the client has not had a response for yet (the one place errors
/// become responses). `req`: the request's head, if one was read. Returns the status the
/// request counts with (the one sent to the client, also when the response was cut short
/// after its head; 499 when the client left before it could be answered) and whether the
/// connection stays open.
async fn answer(
    worker: &Worker,
    conn: &mut ClientConn,
    handled: &Handled,
    (listener, req): (&Listener, Option<&RequestHead>),
    resp: &ResponseHead,
) -> (u16, bool) {
    match &handled.result {
        Ok(keep_alive) => (handled_status(handled, listener, resp), *keep_alive),
        Err(failure) => {
            log_failure(&failure.error, listener, conn);
            if failure.reached == Reached::Head {
                return (handled_status(handled, listener, resp), false);
            }
            let keep_alive =
                req.is_some_and(|req| keeps_after(worker, conn, failure, listener, req));
            let http10 = req.is_some_and(|r| r.minor_version == 0);
            let persistence = Persistence::of(keep_alive, http10);
            let head = req.is_some_and(|r| r.is_head);
            conn.answer_error(failure.error, listener, (persistence, head))
                .await;
            (failure.error.status().unwrap_or(499), keep_alive)
        }
    }
}

/// Whether the connection carries on after Weir answers `failure` to `req`, as nginx's
/// does: only after an upstream failure or no server (502, 503, 504; a client's error
/// closes), when the whole request had been read (a body still arriving, or one an
/// upload left half-read, is not read to its end to save the connection), and when the
/// request's own keep-alive rules allow it.
fn keeps_after(
    worker: &Worker,
    conn: &ClientConn,
    failure: &Failure,
    listener: &Listener,
    req: &RequestHead,
) -> bool {
    let closing = worker.is_draining() || conn.last_request;
    failure.error.side() != Side::Client
        && conn.request_read
        && wants_keep_alive(req, listener, conn.served, closing)
}

/// The outcome of one request: the route it took and whether the connection stays open.
pub(crate) struct Handled {
    pub route: Option<usize>,
    /// Answered by Weir itself (`respond`, `redirect`, `redirect_https`), status in `resp`.
    pub local: bool,
    pub result: Result<bool, Failure>,
}

impl Handled {
    fn local(route: Option<usize>, result: Result<bool, Failure>) -> Handled {
        Handled {
            route,
            local: true,
            result,
        }
    }

    /// Refused before an answer was written: `error` becomes the response.
    fn failed(route: Option<usize>, error: ProxyError) -> Handled {
        Handled {
            route,
            local: false,
            result: Err(error.into()),
        }
    }
}

/// One request: route it, then forward it or answer with the default response.
async fn handle(
    worker: &Worker,
    snapshot: &Snapshot,
    listener_index: usize,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
) -> Handled {
    let listener = &snapshot.config.listeners[listener_index];
    let plan = &snapshot.listeners[listener_index];
    if let (BodyFraming::Length(n), Some(max)) = (req.framing, listener.max_body_size) {
        if n > max {
            return Handled {
                route: None,
                local: false,
                result: Err(ProxyError::BodyTooLarge.into()),
            };
        }
    }
    let closing = worker.is_draining() || conn.last_request;
    let keep_alive = wants_keep_alive(req, listener, conn.served, closing);
    // ACME HTTP-01 before routing and before redirect_https (validation comes on port
    // 80): a prefix comparison for every other path, a lock-free table lookup for these.
    let raw_path = req.path(conn.buf.filled());
    if raw_path.starts_with(crate::tls::auto::challenge::HTTP01_PREFIX) {
        if let Some(key_authorization) = crate::tls::auto::challenge::http01_answer(raw_path) {
            let canned = crate::filters::respond::Canned::respond(&weir_config::LocalResponse {
                status: 200,
                body: key_authorization,
                headers: Vec::new(),
            });
            let answer = Local::Canned(&canned);
            let result = local_response(listener, conn, req, keep_alive, answer, resp).await;
            return Handled::local(None, result);
        }
    }
    // Only what came over plain HTTP: a TLS listener's `http_bind` connections.
    if let Some(redirect) = plan.redirect_https.as_ref().filter(|_| conn.tls.is_none()) {
        let answer = Local::Redirect(redirect);
        let result = local_response(listener, conn, req, keep_alive, answer, resp).await;
        return Handled::local(None, result);
    }
    let buf = conn.buf.filled();
    let path = match conn
        .path
        .normalize(req.path(buf), &listener.path_normalization)
    {
        Ok(path) => path,
        Err(error) => return Handled::failed(None, error),
    };
    let view = RequestView::new(buf, req);
    let route = plan.router.route(req.host_name(buf), path, &view);
    let Some(index) = route else {
        let answer = Local::Canned(plan.default_response());
        let result = local_response(listener, conn, req, keep_alive, answer, resp).await;
        return Handled {
            route,
            local: false,
            result,
        };
    };
    let route_config = &listener.routes[index];
    let rewrite = route_config.rewrite_prefix.as_deref();
    if let Err(error) = check_join(path, &route_config.path_prefix, rewrite) {
        return Handled::failed(route, error);
    }
    let routed = crate::policy::Routed {
        worker,
        snapshot,
        listener: listener_index,
        route: index,
    };
    if let Some(result) = routed.admit(conn, req, resp, keep_alive).await {
        return Handled::local(route, result);
    }
    let upstream = match &plan.routes[index] {
        RoutePlan::Upstream(upstream) => *upstream,
        RoutePlan::Split(split) => {
            let slots = &snapshot.slots.listeners[listener_index];
            let cursor = worker.splits.next(slots.slot, slots.route(route));
            split.pick(cursor, &snapshot.upstreams)
        }
        RoutePlan::Respond(canned) => {
            let answer = Local::Canned(canned);
            let result = local_response(listener, conn, req, keep_alive, answer, resp).await;
            return Handled::local(route, result);
        }
        RoutePlan::Redirect(redirect) => {
            let answer = Local::Redirect(redirect);
            let result = local_response(listener, conn, req, keep_alive, answer, resp).await;
            return Handled::local(route, result);
        }
    };
    let target = crate::forward::exchange_target(
        (listener, listener_index),
        route_config,
        snapshot,
        upstream,
    );
    Handled {
        route,
        local: false,
        result: forward(worker, target, conn, req, resp, keep_alive).await,
    }
}

/// Whether the client connection may carry another request after this one.
fn wants_keep_alive(req: &RequestHead, listener: &Listener, served: u64, draining: bool) -> bool {
    let asked = if req.minor_version == 0 {
        req.connection.keep_alive && !req.connection.close
    } else {
        !req.connection.close
    };
    let under_limit = listener.keepalive_requests == 0 || served < listener.keepalive_requests;
    asked && under_limit && !draining && !listener.keepalive_timeout.is_zero()
}

/// A response Weir writes itself, without an upstream.
enum Local<'a> {
    /// Rendered with the snapshot: the default response (seed 002's default backend for
    /// unrouted requests) or a route's `respond`.
    Canned(&'a Canned),
    /// Rendered per request: a route's `redirect`, or the listener's `redirect_https`.
    Redirect(&'a Redirect),
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
    answer: Local<'_>,
    resp: &mut ResponseHead,
) -> Result<bool, Failure> {
    let mut body = BodyState::new(req.framing, false, listener.max_body_size);
    let (_, consumed) = body
        .take(&mut conn.buf.filled_mut()[req.head_len..])
        .map_err(|_| ProxyError::BadRequest("malformed body"))?;
    let keep_alive = keep_alive && body.is_done();
    let persistence = Persistence::of(keep_alive, req.minor_version == 0);
    let mut out = std::mem::take(&mut conn.out);
    out.clear();
    let bytes = match answer {
        Local::Canned(canned) => {
            resp.status = canned.status;
            canned.bytes(persistence, req.is_head)
        }
        Local::Redirect(redirect) => {
            resp.status = redirect.status;
            let buf = conn.buf.filled();
            let vars = Vars {
                scheme: if conn.tls.is_some() {
                    b"https"
                } else {
                    b"http"
                },
                host: req.host_name(buf),
                target: req.path(buf),
                client_ip: conn.client_text().as_bytes(),
                request_id: conn.request_id.as_bytes(),
            };
            push_redirect(&mut out, redirect, &vars, persistence);
            &out[..]
        }
    };
    conn.buf.consume(req.head_len + consumed);
    let written = conn.write_all(bytes, listener).await;
    conn.out = out;
    written.map_err(Failure::after_head)?;
    Ok(keep_alive)
}

/// The status a successfully handled request was answered with.
fn handled_status(handled: &Handled, listener: &Listener, resp: &ResponseHead) -> u16 {
    match handled.route {
        Some(_) => resp.status,
        None if handled.local => resp.status,
        None => listener.default_response.status,
    }
}

/// Byte counters of the client connection when a request started.
pub(crate) struct Counters {
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// What is known about a request once it is finished.
pub(crate) struct Done {
    /// The listener's config position in the request's snapshot, and its metric slot.
    pub listener: usize,
    pub slot: usize,
    pub method: usize,
    /// Set by the serving loop (HTTP/1 connection or HTTP/2 stream), never per request.
    pub protocol: Protocol,
    pub status: u16,
    pub duration: std::time::Duration,
    pub counters: Counters,
}

/// What `record` needs of the client side: an HTTP/1 connection, or an HTTP/2 stream
/// (`http2/`). Byte counters are totals, from which `Done::counters` is subtracted.
pub(crate) struct ClientSide<'a> {
    pub ip: &'a ClientIp,
    pub fields: &'a RequestFields,
    pub upstream_pick: Option<(usize, usize)>,
    pub upstream_time: Option<std::time::Duration>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The connection's TLS session, on TLS listeners.
    pub tls: Option<&'a crate::tls::session::TlsSession>,
    /// The request's id (empty: none).
    pub request_id: &'a [u8],
    /// What the route's compression did to the response, if it compressed it.
    pub compressed: Option<crate::filters::compression::Compressed>,
    /// The `grpc-status` the client got (gRPC requests on HTTP/2 streams only).
    pub grpc_status: Option<u32>,
}

impl ClientSide<'_> {
    fn of(conn: &ClientConn) -> ClientSide<'_> {
        ClientSide {
            // The client behind trusted proxies when there is one (the log shows it).
            ip: conn.client_text(),
            fields: &conn.log_fields,
            upstream_pick: conn.upstream_pick,
            upstream_time: conn.upstream_time,
            bytes_in: conn.buf.consumed_total(),
            bytes_out: conn.sent,
            tls: conn.tls.as_deref(),
            request_id: conn.request_id.as_bytes(),
            compressed: conn.compressed,
            grpc_status: None,
        }
    }
}

/// Counts one request in this worker's metric shard and writes its access-log line.
pub(crate) fn record(
    worker: &Worker,
    snapshot: &Snapshot,
    conn: &ClientSide<'_>,
    handled: &Handled,
    done: &Done,
) {
    let duration = done.duration;
    let bytes_in = conn.bytes_in - done.counters.bytes_in;
    let bytes_out = conn.bytes_out - done.counters.bytes_out;
    // A response cut short after its head counts with the head's status, plus why.
    let aborted = match &handled.result {
        Err(f) if f.reached == Reached::Head => Some(AbortReason::of(f.error)),
        _ => None,
    };
    if let Some(m) = worker.metrics.listener(done.slot) {
        let route_slot = snapshot.slots.listeners[done.listener].route(handled.route);
        if let Some(route) = m.route(route_slot) {
            route.request(done.protocol, done.method, done.status).inc();
            route.duration(done.protocol).observe(duration);
            if let Some(reason) = aborted {
                route.aborted(done.protocol, reason).inc();
            }
            if let Some(c) = conn.compressed {
                route.compressed_in[c.encoding.index()].add(c.bytes_in);
                route.compressed_out[c.encoding.index()].add(c.bytes_out);
            }
        }
        m.bytes_in.add(bytes_in);
        m.bytes_out.add(bytes_out);
        let reason = match &handled.result {
            Err(failure) if aborted.is_none() => default_reason(failure.error),
            // Answered (if `aborted`, in part) by the default response or the upstream;
            // `respond` and `redirect` answers are not default responses.
            _ => (handled.route.is_none() && !handled.local).then_some(DefaultReason::NoRoute),
        };
        if let Some(reason) = reason {
            m.default_response(reason).inc();
        }
    }
    if let Some(log) = worker.log(done.slot) {
        let config = &snapshot.config;
        let route_name = handled.route.map_or("default", |r| {
            config.listeners[done.listener].routes[r].name.as_str()
        });
        let upstream = conn
            .upstream_pick
            .and_then(|(u, s)| config.upstreams.get(u)?.servers.get(s))
            .map(|s| s.name.as_str());
        let outcome = Outcome {
            client: conn.ip.as_bytes(),
            status: done.status,
            bytes_in,
            bytes_out,
            duration,
            route: route_name,
            upstream,
            upstream_time: conn.upstream_time,
            aborted,
            tls: conn.tls,
            request_id: conn.request_id,
            grpc_status: conn.grpc_status,
        };
        log.log(conn.fields, &outcome);
    }
}

/// Which default-response reason an error counts as (upstream failures are not one).
pub(crate) fn default_reason(error: ProxyError) -> Option<DefaultReason> {
    use ProxyError::*;
    match error {
        NoServer => Some(DefaultReason::NoHealthyServer),
        BadRequest(_) | NotImplemented(_) | MethodNotAllowed | ExpectationFailed
        | VersionNotSupported => Some(DefaultReason::BadRequest),
        BodyTooLarge | HeadTooLarge => Some(DefaultReason::TooLarge),
        HeaderTimeout | ClientTimeout => Some(DefaultReason::Timeout),
        _ => None,
    }
}

fn log_failure(error: &ProxyError, listener: &Listener, conn: &ClientConn) {
    match error.side() {
        crate::error::Side::Client => {
            let client = String::from_utf8_lossy(conn.ip.as_bytes());
            tracing::debug!(listener = %listener.name, %client, %error, "client error")
        }
        // Upstream TLS: already logged where the handshake failed, naming the server.
        _ if matches!(error, ProxyError::UpstreamTls(_)) => {}
        _ => tracing::warn!(listener = %listener.name, %error, "request failed"),
    }
}

#[cfg(test)]
mod task_size {
    fn future_size<A, B, C, D, F: std::future::Future>(_: impl Fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every open connection's task is allocated at this size for its whole life, idle or
    /// not: handling a request is boxed so that 10,000 idle keep-alive connections do not
    /// each carry the state of a request in flight (it was 6,968 bytes inline).
    #[test]
    fn an_idle_connection_task_stays_small() {
        let size = future_size(super::serve_client);
        assert!(size <= 2048, "serve_client's future is {size} bytes");
    }
}
