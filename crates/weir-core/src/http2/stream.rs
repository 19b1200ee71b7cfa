//! One h2 stream, one request: its HTTP/1.1 head, the route, then the upstream exchange,
//! a reply that is not from an upstream (a static file, a cache entry), an RFC 8441
//! WebSocket tunnel, or a local answer (the default response, or an error status), then
//! metrics and the access log through `proxy::record`, as for an HTTP/1.1 request.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};

use super::conn::Shared;
use super::exchange::StreamRequest;
use super::interim::Relayed;
use super::local::{answer_failure, send_answer};
use super::request::{write_head, write_upgrade_head, Line};
use super::scratch::RequestScratch;
use super::stream_log::{StreamConn, StreamLog};
use super::upstream::H2Facts;
use super::websocket::new_key;
use crate::answer::Answer;
use crate::codec::http1::{fill_written, HeadLimits};
use crate::error::ProxyError;
use crate::forward::{carrier, Carrier, Failure};
use crate::metrics::shard::Protocol;
use crate::otel::RequestTrace;
use crate::proxy::route::{Decision, Routing};
use crate::request::Request;
use crate::request::Trace;
use crate::router::RoutedPath;

/// Serves one accepted stream of the connection `shared`. Returns when it ended (read
/// once for its duration; the connection's idle time starts there too).
pub async fn serve(
    shared: Rc<Shared>,
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> Instant {
    let started = Instant::now();
    let worker = &*shared.worker;
    let snapshot = worker.snapshot();
    let Some(index) = snapshot.serving_index(shared.slot, shared.tls.as_deref()) else {
        // A reload removed the listener (or shut this connection out): it is going away.
        shared.refuse(&mut respond);
        return Instant::now();
    };
    let listener = &snapshot.config.listeners[index];
    let (parts, body) = request.into_parts();
    // The HEADERS frame ended the stream: no body (asked once: each asking takes h2's lock).
    let body = Some(body).filter(|body| !body.is_end_stream());
    // The head and its spans come from the worker's spares and go back after the log.
    let mut scratch = worker.h2_scratch.requests.take();
    scratch.head.reserve(512);
    let Some((line, upgrade)) = write_request(&parts, body.is_none(), &mut scratch) else {
        // Malformed (RFC 9113 8.1.1): a stream error. The reset is budgeted like a
        // client reset (MadeYouReset) where it is written out (`io`).
        respond.send_reset(Reason::PROTOCOL_ERROR);
        worker.h2_scratch.requests.give(scratch);
        return Instant::now();
    };
    let facts = H2Facts::of(&parts.headers);
    let mut log = StreamLog {
        trace: Trace {
            grpc: facts.grpc,
            ..Trace::default()
        },
        ..StreamLog::default()
    };
    let at = StreamConn {
        worker,
        snapshot: &snapshot,
        listener: index,
        slot: shared.slot,
        peer_ip: shared.peer_ip,
        ip: &shared.ip,
        tls: shared.tls.as_deref(),
        protocol: Protocol::Http2,
    };
    let max = HeadLimits::of(listener);
    let RequestScratch { head: buf, req } = &mut scratch;
    let result = match fill_written(buf, line.method, line.target, max, req) {
        Ok(()) => {
            let s = Stream {
                at: &at,
                facts: &facts,
                spare: &Cell::new(http::HeaderMap::new()),
                tunnel: upgrade
                    .as_ref()
                    .map(|(p, k)| (p.as_str().as_bytes(), &k[..])),
                tunnels: &shared.tunnels,
            };
            log.note(&at, buf, req);
            let request = at.request(&log.who, buf, req, started);
            let (trace, otel) = (&mut log.trace, &mut log.otel);
            let (route, result) = s
                .handle(request, parts, body, &mut respond, trace, otel)
                .await;
            log.route = route;
            result
        }
        Err(e) => Err(e.into()),
    };
    let status = answer_failure(&mut respond, &result, listener, &shared.ip, &mut log.trace).await;
    let finished = Instant::now();
    if log.trace.reset {
        shared.reset_by_client();
    }
    log.record(&at, result, status, finished - started);
    worker.h2_scratch.requests.give(scratch);
    finished
}

/// An extended CONNECT's `:protocol` and the `Sec-WebSocket-Key` Weir made for it.
type Upgrade = (h2::ext::Protocol, [u8; 24]);

/// Writes the stream's request as an HTTP/1.1 head into `scratch` (its field lines in
/// `req`); an extended CONNECT (RFC 8441) as the Upgrade request it stands for, with a
/// fresh `Sec-WebSocket-Key`, returned with its `:protocol`. `None`: malformed.
fn write_request(
    parts: &http::request::Parts,
    ended: bool,
    scratch: &mut RequestScratch,
) -> Option<(Line, Option<Upgrade>)> {
    let (buf, spans) = (&mut scratch.head, &mut scratch.req.headers);
    let Some(protocol) = parts.extensions.get::<h2::ext::Protocol>() else {
        return write_head(buf, spans, parts, ended).ok().map(|l| (l, None));
    };
    let key = new_key();
    let line = write_upgrade_head(buf, spans, parts, protocol.as_str().as_bytes(), &key);
    Some((line.ok()?, Some((protocol.clone(), key))))
}

/// What a stream's request (its HTTP/1.1 head written and checked) is handled with: the
/// connection (and the snapshot) it came on, and what its HTTP/2 fields said.
struct Stream<'a> {
    at: &'a StreamConn<'a>,
    facts: &'a H2Facts,
    /// A field map for the response's fields (`StreamRequest::spare`): the request's,
    /// emptied, when the upstream speaks HTTP/1.1 (`handle`), its two allocations serving
    /// both heads.
    spare: &'a Cell<http::HeaderMap>,
    /// An extended CONNECT: its `:protocol` and the `Sec-WebSocket-Key` in the head.
    tunnel: Option<(&'a [u8], &'a [u8])>,
    /// The connection's running tunnels.
    tunnels: &'a Cell<u32>,
}

impl<'a> Stream<'a> {
    /// The stream's routing: its listener on its snapshot.
    fn routing(&self) -> Routing<'a> {
        Routing {
            worker: self.at.worker,
            snapshot: self.at.snapshot,
            listener: self.at.listener,
        }
    }

    /// The routing decision, then what it says: forward the request, answer it (the
    /// default response, `respond`, a redirect, a refusal) or refuse it.
    /// `parts`: the client's `request`, for an HTTP/2 upstream's request; `otel`: set to its
    /// trace when it is sampled.
    async fn handle(
        &self,
        request: Request<'_>,
        parts: http::request::Parts,
        body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
        otel: &mut Option<std::rc::Rc<RequestTrace>>,
    ) -> (Option<usize>, Result<(), Failure>) {
        let routing = self.routing();
        // Routed and forwarded on the normalised path, exactly as HTTP/1 requests are.
        let mut path = RoutedPath::default();
        let (route, decided) = routing.decide(&request, &mut path);
        let decision = match decided {
            Ok(decision) => decision,
            Err(check) => Box::pin(routing.verified(&request, &path, check)).await,
        };
        // Without a trace, the request as it is (no copy).
        let traced;
        let r = match routing.trace(route, || request) {
            None => &request,
            Some(trace) => {
                let trace = &*otel.insert(trace);
                traced = Request {
                    trace: Some(trace),
                    ..request
                };
                &traced
            }
        };
        let (target, fill) = match decision {
            Decision::Forward(target, fill) => (target, fill),
            Decision::Answer(answer) => {
                let timeout = routing.listener().http2.stall_timeout;
                let answered = answer_with(answer, r, &path, timeout, respond, trace);
                return (route, answered.await);
            }
            Decision::Reply(reply) => {
                let under = crate::files::Under::of(routing.listener(), route);
                let sent = super::files::respond_stream(respond, r, &path, under, *reply, trace);
                return (route, Box::pin(sent).await);
            }
            Decision::Refuse(error) => return (route, Err(error.into())),
        };
        let r = StreamRequest {
            worker: self.at.worker,
            target,
            request: *r,
            path: &path,
            spare: self.spare,
            relayed: Relayed::default(),
            fill: Cell::new(None),
            response_lines: Cell::default(),
        };
        if let Some((protocol, key)) = self.tunnel {
            // The client's fields are only for an HTTP/2 upstream's request: not kept for
            // the tunnel's lifetime. Boxed, as the HTTP/2 upstream path below: the stream
            // task's future is as large as its largest path, copied when it is spawned.
            drop(parts);
            let tunnel = tunnel(&r, protocol, key, self.tunnels, body, respond, trace);
            return (route, Box::pin(tunnel).await);
        }
        r.continue_if_asked(body.is_some(), respond);
        if let Some(answered) = r.before_forward(fill, respond, trace).await {
            return (route, answered);
        }
        let result = match carrier(Protocol::Http2, r.target.upstream) == Carrier::Http2 {
            true => Box::pin(r.forward_h2(self.facts, parts, body, respond, trace)).await,
            false => {
                // The request's field map, emptied, takes the response's fields (two
                // allocations fewer per stream); the rest is not kept while an HTTP/1.1
                // response streams (a download, SSE).
                let mut headers = parts.headers;
                headers.clear();
                self.spare.set(headers);
                r.forward(body, respond, trace).await
            }
        };
        (route, r.after_forward(result, respond, trace).await)
    }
}

/// Sends Weir's `answer` to the request `r` (each write waiting at most `timeout`).
async fn answer_with(
    answer: Answer<'_>,
    r: &Request<'_>,
    path: &RoutedPath,
    timeout: std::time::Duration,
    respond: &mut SendResponse<Bytes>,
    trace: &mut Trace,
) -> Result<(), Failure> {
    trace.local = answer.is_local();
    let vars = answer.vars(r, path);
    let sent = send_answer(respond, &answer, &vars, r.req.is_head, timeout, trace);
    sent.await.map_err(Failure::after_head)
}

/// An extended CONNECT for `protocol` (its `Sec-WebSocket-Key`, made by Weir: `key`): a
/// WebSocket to an HTTP/1.1 upstream when the route lists `websocket` among its
/// `upgrades`, else 501; 429 past `http2.max_tunnels` of the connection's running
/// `tunnels`.
async fn tunnel(
    r: &StreamRequest<'_>,
    protocol: &[u8],
    key: &[u8],
    tunnels: &Cell<u32>,
    body: Option<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let refuse = |why| Err(ProxyError::NotImplemented(why).into());
    if !protocol.eq_ignore_ascii_case(b"websocket") {
        return refuse("extended CONNECT for a protocol other than websocket");
    }
    if !r.target.route.upgrades.iter().any(|u| u == "websocket") {
        return refuse("websocket is not among the route's upgrades");
    }
    if !crate::forward::tunnels_to(r.target.upstream) {
        return refuse("WebSocket to an HTTP/2-only upstream");
    }
    let Some(body) = body else {
        return Err(ProxyError::BadRequest("extended CONNECT that ends the stream").into());
    };
    // Each tunnel holds an upstream connection for as long as it lasts, which the
    // listener's `max_connections` does not see: one client connection holds at most
    // `max_tunnels` of them, whatever its `max_concurrent_streams`.
    let max = r.target.listener.http2.max_tunnels;
    let Some(_seat) = TunnelSeat::take(tunnels, max) else {
        return Err(ProxyError::TooManyTunnels.into());
    };
    r.forward_websocket(body, respond, key, trace).await
}

/// A tunnel's place among its connection's `max_tunnels`, given back when dropped.
struct TunnelSeat<'a>(&'a Cell<u32>);

impl<'a> TunnelSeat<'a> {
    fn take(running: &'a Cell<u32>, max: u32) -> Option<TunnelSeat<'a>> {
        let n = running.get();
        (n < max).then(|| {
            running.set(n + 1);
            TunnelSeat(running)
        })
    }
}

impl Drop for TunnelSeat<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}
