//! THE pipeline, as one picture (docs/request-lifecycle.md draws it with the same names):
//!
//! ```text
//! client adapter (one per protocol: `http1` here, `http2::stream`, `http3::stream`)
//!   -> request context (`request::Request`: the HTTP/1.1 head every protocol presents, and
//!      who sent it: peer, client behind trusted proxies, TLS, request id)
//!   -> routing decision (`route::Routing::decide`): forward to an upstream (a split
//!      resolved) | answer locally (`answer::Answer`) | reply from a source that is not
//!      an upstream (`Decision::Reply`: a static file, a cache entry) | refuse with a status
//!   -> response source: the upstream (`proxy::forward`; `forward::carrier` says which
//!      side carries it, `forward::driver` tries the servers, `forward::head::Edits` edits
//!      the head, `forward::relay` moves the body), or Weir's own answer, rendered by the
//!      client adapter from one description (`answer`)
//!   -> `record`: metrics and the access log -> keep-alive or close
//! ```
//! A failure nothing was sent for becomes `Answer::Error`, rendered by the adapter like
//! any other answer (`http1::answer`, `http2::stream`'s). Each box exists once; a client
//! protocol adds an adapter, a response source a `Decision` and a body `Source`.

mod forward;
mod http1;
mod revalidate;
pub mod route;

use weir_config::Listener;

use crate::access_log::{Outcome, RequestFields};
use crate::error::ProxyError;
use crate::filters::forwarded::ClientIp;
use crate::forward::{Failure, Reached};
use crate::metrics::shard::Protocol;
use crate::metrics::{AbortReason, DefaultReason};
use crate::request::Trace;
use crate::snapshot::Snapshot;
use crate::worker::Worker;

pub use http1::serve_client;

/// The outcome of one request: the route it took and whether the connection stays open.
pub(crate) struct Handled {
    pub route: Option<usize>,
    /// Answered by Weir itself (`respond`, `redirect`, `redirect_https`, a refusal).
    pub local: bool,
    pub result: Result<bool, Failure>,
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
}

/// What `record` needs of the client side: an HTTP/1 connection's request, or an HTTP/2
/// or HTTP/3 stream. The byte counts are the request's own.
pub(crate) struct ClientSide<'a> {
    pub ip: &'a ClientIp,
    pub fields: &'a RequestFields,
    /// What the exchange left: the server the request went to and how long it took to
    /// answer, what compression and the cache did, the `grpc-status` the client got (gRPC
    /// requests on HTTP/2 and HTTP/3 streams only).
    pub exchange: &'a Trace,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The connection's TLS session, on TLS listeners.
    pub tls: Option<&'a crate::tls::session::TlsSession>,
    /// The request's id (empty: none).
    pub request_id: &'a [u8],
    /// The request's trace, when sampled: its spans end here.
    pub trace: Option<&'a crate::otel::RequestTrace>,
}

/// Counts one request in this worker's metric shard and writes its access-log line.
pub(crate) fn record(
    worker: &Worker,
    snapshot: &Snapshot,
    conn: &ClientSide<'_>,
    handled: &Handled,
    done: &Done,
) {
    let (duration, bytes_in, bytes_out) = (done.duration, conn.bytes_in, conn.bytes_out);
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
            if let Some(c) = conn.exchange.compressed {
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
    if let Some(trace) = conn.trace {
        // Its spans end: answered with the status, an error when it failed (or was cut
        // short after its head).
        let error = match (&handled.result, aborted) {
            (_, Some(reason)) => Some(reason.label()),
            (Err(f), None) => Some(crate::upstream::retry::Outcome::of_error(f.error).reason()),
            (Ok(_), None) => None,
        };
        trace.finish(done.status, error);
    }
    if let Some(log) = worker.log(done.slot) {
        let config = &snapshot.config;
        let route_name = handled.route.map_or("default", |r| {
            config.listeners[done.listener].routes[r].name.as_str()
        });
        let upstream = conn
            .exchange
            .last_try
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
            upstream_time: conn.exchange.last_try.upstream_time,
            aborted,
            tls: conn.tls,
            request_id: conn.request_id,
            grpc_status: conn.exchange.grpc_status,
            trace: conn.trace.map(|t| (&t.trace_id, &t.span_id)),
            cache: conn.exchange.cache,
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
        HeaderTimeout | ClientTimeout | BodyTooSlow => Some(DefaultReason::Timeout),
        _ => None,
    }
}

/// Logs a request from `client` that failed, whatever protocol it came over: called by
/// each adapter where a failure becomes its answer (`http1::answer`,
/// `http2::local::answer_failure`), which a request that did not fail never reaches.
pub(crate) fn log_failure(failure: &Failure, listener: &Listener, client: &ClientIp) {
    let error = &failure.error;
    match error.side() {
        crate::error::Side::Client => {
            let client = String::from_utf8_lossy(client.as_bytes());
            tracing::debug!(listener = %listener.name, %client, %error, "client error")
        }
        // Upstream TLS: already logged where the handshake failed, naming the server.
        _ if matches!(error, ProxyError::UpstreamTls(_)) => {}
        _ => tracing::warn!(listener = %listener.name, %error, "request failed"),
    }
}
