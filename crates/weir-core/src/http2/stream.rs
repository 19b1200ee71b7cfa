//! One h2 stream, one request: its HTTP/1.1 head, the route, then the upstream exchange
//! or a local answer (the default response, or an error status), then metrics and the
//! access log through `proxy::record`, as for an HTTP/1.1 request.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::Request;

use super::conn::Shared;
use super::exchange::{StreamRequest, Trace};
use super::grpc;
use super::interim::Relayed;
use super::local::send_rendered;
use super::request::{write_head, write_upgrade_head};
use super::scratch::RequestScratch;
use super::send::send_data;
use super::upstream::{speaks_h2, H2Facts};
use super::websocket::new_key;
use crate::access_log::RequestFields;
use crate::codec::http1::write::Persistence;
use crate::codec::http1::{fill_written, BodyFraming, RequestHead};
use crate::error::{reason_phrase, ProxyError};
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::filters::real_ip::client_behind;
use crate::filters::redirect::push_redirect;
use crate::filters::request_id::{self, RequestId};
use crate::filters::rewrite::check_join;
use crate::forward::{exchange_target, Failure, Reached};
use crate::metrics::shard::{method_index, Protocol, METHODS};
use crate::policy::{Answer, Asker, Routed};
use crate::proxy::{record, ClientSide, Counters, Done, Handled};
use crate::router::{RequestView, RoutedPath};
use crate::snapshot::{RoutePlan, Snapshot};
use weir_config::Redirect;

/// Serves one accepted stream of the connection `shared`. Returns when it ended (read
/// once for its duration; the connection's idle time starts there too).
pub async fn serve(
    shared: Rc<Shared>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> Instant {
    let started = Instant::now();
    let worker = &*shared.worker;
    let snapshot = worker.snapshot();
    let Some(index) = snapshot.listener_index(shared.slot) else {
        // A reload removed the listener: the connection is going away.
        shared.refuse(&mut respond);
        return Instant::now();
    };
    let listener = &snapshot.config.listeners[index];
    let (parts, body) = request.into_parts();
    // The HEADERS frame ended the stream: no body (asked once: each asking takes h2's lock).
    let ended = body.is_end_stream();
    // The head and its spans come from the worker's spares and go back after the log.
    let RequestScratch {
        head: mut buf,
        mut req,
    } = worker.h2_scratch.take_request();
    buf.reserve(512);
    // An extended CONNECT (RFC 8441) stands for an HTTP/1.1 Upgrade request.
    let protocol = parts.extensions.get::<h2::ext::Protocol>().cloned();
    let key = protocol.as_ref().map(|_| new_key());
    let spans = &mut req.headers;
    let written = match (&protocol, &key) {
        (Some(p), Some(key)) => {
            write_upgrade_head(&mut buf, spans, &parts, p.as_str().as_bytes(), key)
        }
        _ => write_head(&mut buf, spans, &parts, ended),
    };
    let Ok(line) = written else {
        // Malformed (RFC 9113 8.1.1): a stream error. The reset is budgeted like a
        // client reset (MadeYouReset) where it is written out (`io`).
        respond.send_reset(Reason::PROTOCOL_ERROR);
        worker
            .h2_scratch
            .give_request(RequestScratch { head: buf, req });
        return Instant::now();
    };
    let facts = H2Facts::of(&parts.headers);
    // A field map for the response's fields (`spare`): the request's, emptied, when the
    // upstream speaks HTTP/1.1 (`handle`), its two allocations serving both heads.
    let spare = Cell::new(http::HeaderMap::new());
    let mut fields = RequestFields::default();
    let mut trace = Trace {
        grpc: facts.grpc,
        ..Trace::default()
    };
    // The client: the peer, or the address behind `trusted_proxies` (as for HTTP/1).
    let mut client = (shared.peer_ip, shared.ip);
    let mut request_id = RequestId::default();
    let filled = fill_written(
        &buf,
        line.method,
        line.target,
        listener.max_headers,
        &mut req,
    );
    let (route, result, method) = match filled {
        Ok(()) => {
            if let Some(id) = &listener.policy.request_id {
                request_id::assign(&mut request_id, &worker.request_ids, id, &buf, &req);
            }
            let trusted = &listener.policy.trusted_proxies;
            if !trusted.is_empty() {
                if let Some(ip) = client_behind(shared.peer_ip, trusted, &buf, &req.headers) {
                    client = (ip, ClientIp::new(ip));
                }
            }
            if worker.log(shared.slot).is_some() {
                fields.capture(&buf, &req);
                fields.http2 = true;
            }
            let method = method_index(&buf[req.method.clone()]);
            let body = (!ended).then_some(body);
            let s = Stream {
                shared: &shared,
                snapshot: &snapshot,
                index,
                buf: &buf,
                req: &req,
                client: (client.0, &client.1),
                request_id: request_id.as_bytes(),
                started,
                facts: &facts,
                spare: &spare,
                tunnel: protocol
                    .as_ref()
                    .zip(key.as_ref())
                    .map(|(p, k)| (p.as_str().as_bytes(), &k[..])),
            };
            let (route, result) = s.handle(parts, body, &mut respond, &mut trace).await;
            (route, result, method)
        }
        Err(e) => (None, Err(e.into()), METHODS.len() - 1),
    };
    let status = answer(&mut respond, &result, (listener, facts.grpc), &mut trace).await;
    if trace.reset {
        shared.reset_by_client();
    }
    if let Some(m) = worker.metrics.listener(shared.slot) {
        m.http2.streams.inc();
    }
    let handled = Handled {
        route,
        local: trace.local,
        result: result.map(|()| true),
    };
    let finished = Instant::now();
    let done = Done {
        listener: index,
        slot: shared.slot,
        method,
        protocol: Protocol::Http2,
        status,
        duration: finished - started,
        counters: Counters {
            bytes_in: 0,
            bytes_out: 0,
        },
    };
    let side = ClientSide {
        ip: &client.1,
        fields: &fields,
        upstream_pick: trace.upstream_pick,
        upstream_time: trace.upstream_time,
        bytes_in: trace.body_in,
        bytes_out: trace.body_out,
        tls: shared.tls.as_deref(),
        request_id: request_id.as_bytes(),
        compressed: trace.compressed,
        grpc_status: trace.grpc_status,
    };
    record(worker, &snapshot, &side, &handled, &done);
    worker
        .h2_scratch
        .give_request(RequestScratch { head: buf, req });
    finished
}

/// A parsed request on the snapshot it runs on.
struct Stream<'a> {
    shared: &'a Shared,
    snapshot: &'a Snapshot,
    index: usize,
    buf: &'a [u8],
    req: &'a RequestHead,
    /// The client's address, and as text (behind trusted proxies when there are some).
    client: (std::net::IpAddr, &'a ClientIp),
    /// The request's id (empty: the listener has `request_id = false`).
    request_id: &'a [u8],
    started: Instant,
    facts: &'a H2Facts,
    /// The request's field map, for the response's fields (`StreamRequest::spare`).
    spare: &'a Cell<http::HeaderMap>,
    /// An extended CONNECT: its `:protocol` and the `Sec-WebSocket-Key` in the head.
    tunnel: Option<(&'a [u8], &'a [u8])>,
}

impl Stream<'_> {
    /// Routes the request, then forwards it or sends the default response.
    /// `parts`: the client's request, for an HTTP/2 upstream's request.
    async fn handle(
        &self,
        parts: http::request::Parts,
        body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> (Option<usize>, Result<(), Failure>) {
        let listener = &self.snapshot.config.listeners[self.index];
        let plan = &self.snapshot.listeners[self.index];
        if let (BodyFraming::Length(n), Some(max)) = (self.req.framing, listener.max_body_size) {
            if n > max {
                return (None, Err(ProxyError::BodyTooLarge.into()));
            }
        }
        // Only what came over plain HTTP: a TLS listener's `http_bind` connections.
        if let Some(redirect) = plan
            .redirect_https
            .as_ref()
            .filter(|_| self.shared.tls.is_none())
        {
            return (None, self.redirect(redirect, respond, trace).await);
        }
        // Routed and forwarded on the normalised path, exactly as HTTP/1 requests are.
        let mut path = RoutedPath::default();
        let routed = match path.normalize(self.req.path(self.buf), &listener.path_normalization) {
            Ok(routed) => routed,
            Err(error) => return (None, Err(error.into())),
        };
        let view = RequestView::new(self.buf, self.req);
        let route = plan
            .router
            .route(self.req.host_name(self.buf), routed, &view);
        let Some(index) = route else {
            let d = &listener.default_response;
            trace.status = d.status;
            if self.facts.grpc && grpc::translates(d.status) {
                // Its body is for browsers (maybe a page): the reason phrase says it.
                let code = grpc::code_for_status(d.status);
                let message = grpc::message(d.status, b"");
                let sent = grpc::send_status(respond, code, message, http::HeaderMap::new());
                if sent.is_ok() {
                    trace.grpc_status = Some(u32::from(code));
                }
                return (None, sent.map_err(Failure::after_head));
            }
            let sent = local(
                respond,
                d.status,
                &d.content_type,
                d.body.as_bytes(),
                self.req.is_head,
                listener.http2.stall_timeout,
            )
            .await;
            trace.body_out = sent.as_ref().map_or(0, |n| *n);
            return (None, sent.map(|_| ()).map_err(Failure::after_head));
        };
        let route_config = &listener.routes[index];
        let rewrite = route_config.rewrite_prefix.as_deref();
        if let Err(error) = check_join(routed, &route_config.path_prefix, rewrite) {
            return (route, Err(error.into()));
        }
        // The route's access lists, rate limit and basic auth, as for HTTP/1 requests.
        let routed = Routed {
            worker: &self.shared.worker,
            snapshot: self.snapshot,
            listener: self.index,
            route: index,
        };
        let asker = Asker {
            client: self.client.0,
            buf: self.buf,
            req: self.req,
            now: self.started,
            protocol: Protocol::Http2,
        };
        let mut extra = Vec::new();
        if let Some(status) = routed.refusal(&asker, &mut extra) {
            let mut rendered = Vec::with_capacity(256);
            let answer = Answer {
                status,
                headers: &extra,
            };
            answer.render(&mut rendered, Persistence::KeepAlive);
            return (route, self.local(&rendered, respond, trace).await);
        }
        let upstream = match &plan.routes[index] {
            RoutePlan::Upstream(upstream) => *upstream,
            RoutePlan::Split(split) => {
                let slots = &self.snapshot.slots.listeners[self.index];
                let worker = &self.shared.worker;
                let cursor = worker.splits.next(slots.slot, slots.route(route));
                split.pick(cursor, &self.snapshot.upstreams)
            }
            RoutePlan::Respond(canned) => {
                let rendered = canned.bytes(Persistence::KeepAlive, false);
                return (route, self.local(rendered, respond, trace).await);
            }
            RoutePlan::Redirect(redirect) => {
                return (route, self.redirect(redirect, respond, trace).await);
            }
        };
        let r = StreamRequest {
            worker: &self.shared.worker,
            target: exchange_target(
                (listener, self.index),
                route_config,
                self.snapshot,
                upstream,
            ),
            ip: &self.shared.ip,
            client: self.client.1,
            request_id: self.request_id,
            tls: self.shared.tls.as_deref(),
            buf: self.buf,
            req: self.req,
            path: &path,
            spare: self.spare,
            started: self.started,
            relayed: Relayed::default(),
        };
        if let Some((protocol, key)) = self.tunnel {
            // The client's fields are only for an HTTP/2 upstream's request: not kept for
            // the tunnel's lifetime.
            drop(parts);
            // Boxed, as the HTTP/2 upstream path below: the stream task's future is as large
            // as its largest path, and it is copied when the task is spawned.
            let tunnel = Box::pin(tunnel(&r, protocol, key, body, respond, trace));
            return (route, tunnel.await);
        }
        if r.answers_continue(body.is_some()) {
            // The client may wait for 100 before sending DATA; Weir reads the body at once,
            // so it says so itself (and relays no upstream 100 after it: `interim`).
            let mut go_on = http::Response::new(());
            *go_on.status_mut() = http::StatusCode::CONTINUE;
            let _ = respond.send_informational(go_on);
        }
        let result = match speaks_h2(r.target.upstream) {
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
        (route, result)
    }

    /// Sends `rendered`, an answer Weir made itself (`respond`, `redirect`).
    async fn local(
        &self,
        rendered: &[u8],
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let timeout = self.snapshot.config.listeners[self.index]
            .http2
            .stall_timeout;
        trace.local = true;
        let how = (self.req.is_head, self.facts.grpc);
        send_rendered(respond, rendered, how, timeout, trace)
            .await
            .map_err(Failure::after_head)
    }

    /// Answers with `redirect`, its template filled from this request.
    async fn redirect(
        &self,
        redirect: &Redirect,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let vars = Vars {
            scheme: if self.shared.tls.is_some() {
                b"https"
            } else {
                b"http"
            },
            host: self.req.host_name(self.buf),
            target: self.req.path(self.buf),
            request_id: self.request_id,
            client_ip: self.client.1.as_bytes(),
        };
        let mut rendered = Vec::with_capacity(256);
        push_redirect(&mut rendered, redirect, &vars, Persistence::KeepAlive);
        self.local(&rendered, respond, trace).await
    }
}

/// An extended CONNECT: a WebSocket to an HTTP/1.1 upstream when the route lists
/// `websocket` among its `upgrades`, else 501.
async fn tunnel(
    r: &StreamRequest<'_>,
    protocol: &[u8],
    key: &[u8],
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
    // The tunnel is an HTTP/1.1 Upgrade on a connection of its own, made with ALPN
    // `http/1.1` over TLS (as for HTTP/1 clients), so `auto` and TLS `h2` upstreams take
    // it; only an `h2c` upstream, which speaks nothing but HTTP/2, cannot.
    if r.target.upstream.protocol == weir_config::UpstreamProtocol::H2c {
        return refuse("WebSocket to an h2c-only upstream");
    }
    let Some(body) = body else {
        return Err(ProxyError::BadRequest("extended CONNECT that ends the stream").into());
    };
    r.forward_websocket(body, respond, key, trace).await
}

/// Answers a failure nothing was sent for yet with its status (or resets the stream when
/// there is none to give), as a gRPC status to a gRPC request. Returns the status the
/// request counts with.
async fn answer(
    respond: &mut SendResponse<Bytes>,
    result: &Result<(), Failure>,
    (listener, grpc): (&weir_config::Listener, bool),
    trace: &mut Trace,
) -> u16 {
    let failure = match result {
        Ok(()) => return trace.status,
        Err(f) if f.reached == Reached::Head => return trace.status,
        Err(f) => f,
    };
    let Some(status) = failure.error.status().filter(|_| !trace.reset) else {
        respond.send_reset(Reason::CANCEL);
        return 499;
    };
    if grpc {
        trace.grpc_status = grpc::answer_failure(respond, failure.error, status).map(u32::from);
        return status;
    }
    let mut body = failure
        .error
        .body_text()
        .unwrap_or(reason_phrase(status))
        .as_bytes()
        .to_vec();
    body.push(b'\n');
    if let Ok(n) = local(
        respond,
        status,
        "text/plain",
        &body,
        false,
        listener.http2.stall_timeout,
    )
    .await
    {
        trace.body_out = n;
    }
    status
}

/// Sends a response Weir makes itself. Returns the body bytes sent.
async fn local(
    respond: &mut SendResponse<Bytes>,
    status: u16,
    content_type: &str,
    body: &[u8],
    is_head: bool,
    timeout: std::time::Duration,
) -> Result<u64, ProxyError> {
    let mut head = http::Response::new(());
    *head.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let headers = head.headers_mut();
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        headers.insert(http::header::CONTENT_TYPE, v);
    }
    headers.insert(http::header::CONTENT_LENGTH, body.len().into());
    let empty = is_head || body.is_empty();
    let mut send = respond
        .send_response(head, empty)
        .map_err(|_| ProxyError::ClientClosed)?;
    if empty {
        return Ok(0);
    }
    send_data(&mut send, body, true, timeout)
        .await
        .map_err(|_| ProxyError::ClientClosed)?;
    Ok(body.len() as u64)
}
