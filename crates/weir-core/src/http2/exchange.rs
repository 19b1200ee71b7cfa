//! One h2 stream's exchange with an HTTP/1.1 upstream server.
//!
//! The tries are the driver's (`forward::driver`), over `forward::h1` (the head written for
//! each try's server, a pooled or new connection, the final head with 1xx relayed by
//! `interim`), as for HTTP/1.x clients. What differs is the body: request DATA is written
//! upstream and only then released to the client's window (flow control follows the
//! upstream's pace), and the response body goes out as DATA within the client's window.
//! A client reset during any wait drops the upstream connection: the server sees the
//! request cancelled, and a half-done exchange is never pooled.

use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use tokio::io::AsyncWrite;
use weir_config::UpstreamServer;

use super::interim::{Bounds, ClientStream, Relayed};
use super::names::response_name;
use super::scratch::ExchangeScratch;
use super::send::{send_bytes, send_data, unless_reset, Stop};
use super::trailers;
use crate::buffer::Buffer;
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::connector::{UpstreamStream, WriteHalf};
use crate::error::ProxyError;
use crate::filters::compression::{self, Compressed, Encoder, Plan};
use crate::filters::headers::{append_to_map, apply_to_map};
use crate::filters::location::ReverseMap;
use crate::filters::upgrade::Offered;
use crate::forward::body::{self, BodyState, PumpError};
use crate::forward::driver::{drive, Accepted, Attempt, Exchange, LastTry, Miss, Sender, Tries};
use crate::forward::h1::{
    reuse, send_streaming, send_whole, upstream_pump_error, Reading, RequestMeta,
};
use crate::forward::request_head::write_upstream_head;
use crate::forward::{Failure, Reached, Target};
use crate::proxy::route::Request;
use crate::router::RoutedPath;
use crate::time::{with_timeout, LazyTimer};
use crate::upstream::RequestKey;
use crate::worker::Worker;

/// One stream's request, as the HTTP/1.1 head `request` wrote and the codec parsed.
pub struct StreamRequest<'a> {
    pub worker: &'a Worker,
    pub target: Target<'a>,
    pub request: Request<'a>,
    /// The request's path, normalised as it was routed (what goes upstream).
    pub path: &'a RoutedPath,
    /// The upstream's 1xx heads relayed so far: bounded per response, over every try.
    pub relayed: Relayed,
    /// A field map to fill with the response's (the request's, its allocations kept):
    /// taken by the first response head built, an empty map after that.
    pub spare: &'a std::cell::Cell<http::HeaderMap>,
}

/// What the access log and metrics learn from the exchange.
#[derive(Debug, Default)]
pub struct Trace {
    pub upstream_pick: Option<(usize, usize)>,
    pub upstream_time: Option<Duration>,
    pub status: u16,
    pub body_in: u64,
    pub body_out: u64,
    /// The client reset the stream: the upstream request was cancelled.
    pub reset: bool,
    /// Answered by Weir itself (`respond`, `redirect`), not by an upstream.
    pub local: bool,
    /// What the route's compression did to the response, if it compressed it.
    pub compressed: Option<crate::filters::compression::Compressed>,
    /// The request is gRPC's (`H2Facts::grpc`): the `grpc-status` sent is last_try.
    pub grpc: bool,
    /// The `grpc-status` the client got (a gRPC request only; `None`: none, or not a
    /// number), from the upstream's head or trailers or from Weir's own answer.
    pub grpc_status: Option<u32>,
}

impl Trace {
    /// The `grpc-status` among `fields` (a response head or trailers about to go to the
    /// client) if the request is gRPC: digits only (`+5` is no status). Nothing is looked
    /// up for other requests. LastTry by [`Trace::sent_grpc_status`] once `fields` were sent.
    pub fn grpc_status_in(&self, fields: &http::HeaderMap) -> Option<u32> {
        if !self.grpc {
            return None;
        }
        let v = fields.get("grpc-status")?.as_bytes();
        if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(v).ok()?.parse().ok()
    }

    /// Notes `status` (from [`Trace::grpc_status_in`]) once its fields reached the client.
    pub fn sent_grpc_status(&mut self, status: Option<u32>) {
        if status.is_some() {
            self.grpc_status = status;
        }
    }
}

impl StreamRequest<'_> {
    /// What every try of the request shares.
    pub(super) fn exchange_of(&self) -> Exchange<'_> {
        let (r, u) = (&self.request, self.target.upstream);
        let path = self.path.get(r.req.path(r.buf));
        let client = r.origin.client_text();
        Exchange {
            worker: self.worker,
            target: self.target,
            key: RequestKey::new(&u.lb, r.buf, r.req, path, client),
            idempotent: r.req.idempotent,
        }
    }

    /// Appends the upstream HTTP/1.1 head for `server` (`forward::request_head`).
    pub(super) fn write_head(&self, out: &mut Vec<u8>, server: &UpstreamServer) -> Offered {
        write_upstream_head(out, &self.request, self.path, &self.target, server)
    }

    /// Applies the route's `response_headers` to an HTTP/2 upstream's head (`http2/
    /// upstream.rs`), as `response_head` does for an HTTP/1.1 upstream's.
    pub(super) fn edit_response(&self, headers: &mut http::HeaderMap) {
        if let Some(rules) = &self.target.route.filters.response_headers {
            apply_to_map(headers, rules, &self.request.vars(), &mut Vec::new());
        }
    }

    /// Forwards the request and relays the response. On `Err` nothing final was sent
    /// (`Reached::Nothing`: the caller answers) or the stream was reset.
    pub async fn forward(
        &self,
        body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let mut up_buf = self.worker.take_buffer();
        let mut scratch = self.worker.h2_scratch.take_exchange();
        let result = self
            .exchange(body, respond, &mut up_buf, &mut scratch, trace)
            .await;
        self.worker.h2_scratch.give_exchange(scratch);
        self.worker.give_buffer(up_buf);
        result
    }

    async fn exchange(
        &self,
        body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        up_buf: &mut Buffer,
        scratch: &mut ExchangeScratch,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let ExchangeScratch { out, resp, timer } = scratch;
        let x = self.exchange_of();
        let mut last_try = LastTry::default();
        let accepted = {
            let client = self.client_stream(respond, body.is_some());
            let mut sender = StreamSender {
                r: self,
                x: &x,
                body,
                up_buf: &mut *up_buf,
                out,
                resp: &mut *resp,
                timer,
                interim: &client,
                body_in: &mut trace.body_in,
            };
            // Pinned where it is built: the future holds every await of the upstream
            // exchange (large), and `unless_reset` would otherwise move it into its own
            // state once more (callgrind: about -0.4k instructions of `memcpy` per stream).
            let started = self.request.started;
            let driving = std::pin::pin!(drive(&x, &mut sender, started, &mut last_try));
            unless_reset(&mut &client, driving).await
        };
        trace.upstream_pick = last_try.upstream_pick;
        trace.upstream_time = last_try.upstream_time;
        let accepted = match accepted {
            Ok(accepted) => accepted?,
            Err(stop) => return Err(stopped(stop, Reached::Nothing, trace)),
        };
        let ((mut stream, request_done), accepted) = accepted.take();
        accepted.count(Ok(resp.status));
        trace.status = resp.status;
        // One copy of what arrived (the head, often the whole body too): the head's values
        // and the first DATA are slices of it, not an allocation each.
        let arrived = self.worker.h2_scratch.copy(up_buf.filled());
        let plan = self.plan(up_buf.filled(), resp);
        let head = self.response_head(resp, &arrived, &accepted, &plan);
        up_buf.consume(resp.head_len);
        // The whole body came with the head (the usual small response): the connection is
        // idle from the head's arrival; else from the end of the relay (as for HTTP/1.1).
        let body_with_head = match resp.framing {
            BodyFraming::None => true,
            BodyFraming::Length(n) => up_buf.filled().len() as u64 >= n,
            BodyFraming::Chunked | BodyFraming::UntilClose => false,
        };
        // A chunked body is decoded in place in `up_buf`: its bytes differ from `arrived`.
        let first = (resp.framing != BodyFraming::Chunked).then(|| arrived.slice(resp.head_len..));
        let body = ResponseBody { plan: &plan, first };
        self.respond_with(respond, head, resp, (&mut stream, up_buf), body, trace)
            .await?;
        let reusable = resp.keeps_alive() && request_done && up_buf.is_empty();
        if reusable && !(self.request.req.is_head && resp.framing == BodyFraming::UntilClose) {
            // Idle since the head arrived when the body came with it, a time already read
            // (no clock read for the usual small response); after a streamed body, from now.
            let since = match body_with_head {
                true => accepted.head_at,
                false => Instant::now(),
            };
            reuse(&x, accepted.server, accepted.metrics, stream, since);
        }
        Ok(())
    }

    /// Whether Weir answers the client's `expect: 100-continue` itself (for a request with
    /// a body, `body`): it reads the body at once, so the client need not wait.
    pub(super) fn answers_continue(&self, body: bool) -> bool {
        self.request.req.expect_continue && body
    }

    /// The client's stream while the final head is awaited: up to the listener's
    /// `max_informational` 1xx heads relayed (of `max_header_list_size` in all) per
    /// response, a 100 only if Weir sent none.
    pub(super) fn client_stream<'s>(
        &'s self,
        respond: &'s mut SendResponse<Bytes>,
        body: bool,
    ) -> ClientStream<'s> {
        let h2 = &self.target.listener.http2;
        let bounds = Bounds {
            heads: h2.max_informational,
            bytes: h2.max_header_list_size,
            sent_continue: self.answers_continue(body),
        };
        ClientStream::new(respond, &self.relayed, bounds)
    }

    pub(super) fn meta(&self) -> RequestMeta {
        RequestMeta {
            is_head: self.request.req.is_head,
            // 1xx heads go to the client's stream (`interim`).
            http10: false,
            upgrade: Offered::default(),
            accepted: None,
            max_informational: self.informational_bound(),
        }
    }

    /// The most 1xx heads an upstream may send before its final head: the listener's
    /// `max_informational`, or `http2.max_informational` when that relays more (the stream
    /// drops those past it, `interim`). One more fails the response (502), so an upstream
    /// looping on 103 cannot hold the stream until `response_timeout`.
    pub(super) fn informational_bound(&self) -> u32 {
        let listener = &self.target.listener;
        listener
            .max_informational
            .max(listener.http2.max_informational)
    }

    /// What the route's compression does to `resp` (nothing without `compression`).
    fn plan(&self, buf: &[u8], resp: &ResponseHead) -> Plan {
        let Some(cfg) = &self.target.route.filters.compression else {
            return Plan::default();
        };
        let response = compression::Response {
            status: resp.status,
            buf,
            headers: &resp.headers,
            framing: resp.framing,
            is_head: self.request.req.is_head,
            accepted: compression::negotiate(cfg, self.request.buf, &self.request.req.headers),
            rules: self.target.route.filters.response_headers.as_ref(),
        };
        compression::plan(cfg, &response)
    }

    /// The encoder of a compressed response; its counts start in `trace`.
    fn encoder(
        &self,
        encoding: weir_config::Encoding,
        cfg: &weir_config::Compression,
        length: Option<u64>,
        trace: &mut Trace,
    ) -> Result<Encoder, Failure> {
        trace.compressed = Some(Compressed {
            encoding,
            bytes_in: 0,
            bytes_out: 0,
        });
        Encoder::new(encoding, &cfg.levels, length)
            .map_err(|_| Failure::from(ProxyError::UpstreamMalformed("compressor failed")))
    }

    /// Sends `head`, then relays the body `resp` announces from the upstream stream,
    /// compressed when `body.plan` says so (the stream is reset when that fails).
    pub(super) async fn respond_with(
        &self,
        respond: &mut SendResponse<Bytes>,
        head: http::Response<()>,
        resp: &ResponseHead,
        (stream, up_buf): (&mut UpstreamStream, &mut Buffer),
        body: ResponseBody<'_>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        // A chunked body's trailers go to the client as trailing HEADERS (`relay`).
        let mut state = BodyState::new(resp.framing, true, None).keeping_trailers();
        let empty = self.request.req.is_head || state.is_done();
        let mut encoder = match (body.plan.encoding, &self.target.route.filters.compression) {
            (Some(e), Some(cfg)) if !empty => {
                Some(self.encoder(e, cfg, resp.framing.length(), trace)?)
            }
            _ => None,
        };
        let grpc_status = trace.grpc_status_in(head.headers());
        let mut send = respond
            .send_response(head, empty)
            .map_err(|_| Failure::after_head(ProxyError::ClientClosed))?;
        trace.sent_grpc_status(grpc_status);
        if !empty {
            let pump = (&mut state, encoder.as_mut());
            let relayed = self
                .relay(&mut send, stream, up_buf, pump, body, trace)
                .await;
            if let Err(stop) = relayed {
                send.send_reset(Reason::CANCEL);
                return Err(stopped(stop, Reached::Head, trace));
            }
        }
        Ok(())
    }

    /// Streams the response body from the upstream to the client, through `encoder`
    /// when the body is compressed (each upstream read flushed into DATA).
    async fn relay(
        &self,
        send: &mut SendStream<Bytes>,
        stream: &mut UpstreamStream,
        up_buf: &mut Buffer,
        (state, mut encoder): (&mut BodyState, Option<&mut Encoder>),
        ResponseBody { plan, mut first }: ResponseBody<'_>,
        trace: &mut Trace,
    ) -> Result<(), Stop> {
        // A client that gives no window for `stall_timeout` gets the stream reset.
        let stall_timeout = self.target.listener.http2.stall_timeout;
        let upstream_timeout = self.target.upstream.response_timeout;
        let pump_error = |e| Stop::Error(upstream_pump_error(e));
        let max_trailers = self.target.listener.http2.max_header_list_size;
        // Trailers lose what the head lost: the route's `response_headers` set and remove
        // names, and what compression drops (digests of the uncompressed body).
        let rules = self.target.route.filters.response_headers.as_ref();
        let dropped = |name: &[u8]| plan.drops(name) || rules.is_some_and(|r| r.drops(name));
        loop {
            let (forward, consumed) = state.take(up_buf.filled_mut()).map_err(pump_error)?;
            let done = state.is_done();
            // Trailers (chunked only) end the stream in their own HEADERS frame.
            let trailers = done.then(|| trailers::to_h2(state.trailers(), max_trailers, dropped));
            let trailers = trailers.flatten();
            let end = done && trailers.is_none();
            let sent = match encoder.as_deref_mut() {
                None => {
                    // `first` holds the same bytes as `up_buf` on the first round (not chunked).
                    let data = match first.take() {
                        Some(first) => first.slice(..forward),
                        None => Bytes::copy_from_slice(&up_buf.filled()[..forward]),
                    };
                    send_bytes(send, data, end, stall_timeout).await?;
                    forward
                }
                Some(e) => {
                    let data = &up_buf.filled()[..forward];
                    send_encoded(send, e, data, (done, end), stall_timeout, trace).await?
                }
            };
            trace.body_out += sent as u64;
            up_buf.consume(consumed);
            if let Some(fields) = trailers {
                let grpc_status = trace.grpc_status_in(&fields);
                send.send_trailers(fields)
                    .map_err(|_| Stop::Error(ProxyError::ClientClosed))?;
                trace.sent_grpc_status(grpc_status);
            }
            if done {
                return Ok(());
            }
            let read = with_timeout(upstream_timeout, up_buf.read_from(stream));
            match unless_reset(send, read).await? {
                Err(_) => return Err(pump_error(PumpError::ReadTimeout)),
                Ok(Err(e)) => return Err(pump_error(PumpError::Read(e.kind()))),
                Ok(Ok(0)) if up_buf.is_full() => {
                    return Err(pump_error(PumpError::Framing("chunk line too long")))
                }
                // The body ends here: the next turn sends the end of the stream.
                Ok(Ok(0)) if state.on_eof() => {}
                Ok(Ok(0)) => return Err(pump_error(PumpError::Truncated)),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The h2 response head for the upstream's `resp` (parsed from `buf`): hop-by-hop and
    /// `Connection`-listed fields dropped, names lower-cased, locations reverse-mapped,
    /// the sticky-session cookie added.
    fn response_head(
        &self,
        resp: &ResponseHead,
        buf: &Bytes,
        accepted: &Accepted<'_, ()>,
        plan: &Plan,
    ) -> http::Response<()> {
        let mut response = self.end_to_end_head(resp, buf, accepted.server, plan);
        if let Some(value) = accepted.set_cookie().and_then(cookie_value) {
            response
                .headers_mut()
                .append(http::header::SET_COOKIE, value);
        }
        response
    }

    /// The h2 response head with the end-to-end fields of `resp` (parsed from `buf`, from
    /// `server`): hop-by-hop and `Connection`-listed fields dropped, names lower-cased,
    /// locations reverse-mapped, the route's `response_headers` rules and the compression
    /// `plan`'s edits applied.
    pub(super) fn end_to_end_head(
        &self,
        resp: &ResponseHead,
        buf: &Bytes,
        server: &UpstreamServer,
        plan: &Plan,
    ) -> http::Response<()> {
        let mut response = http::Response::new(());
        *response.status_mut() =
            http::StatusCode::from_u16(resp.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
        let headers = response.headers_mut();
        *headers = self.spare.take();
        debug_assert!(
            headers.is_empty(),
            "the spare map is cleared where it is set"
        );
        let reverse = self.reverse_map(server);
        let mut mapped = Vec::new();
        let rules = self.target.route.filters.response_headers.as_ref();
        for h in &resp.headers {
            if h.connection_listed || h.kind.is_hop_by_hop() {
                continue;
            }
            let name = &buf[h.name.clone()];
            if plan.drops(name) || rules.is_some_and(|r| r.drops(name)) {
                continue;
            }
            let raw = &buf[h.value.clone()];
            mapped.clear();
            let map = reverse.as_ref().filter(|_| is_location(h.kind));
            let value = match map {
                Some(map) if map.map_into(raw, &mut mapped) => {
                    http::HeaderValue::from_bytes(&mapped)
                }
                _ => http::HeaderValue::from_maybe_shared(buf.slice(h.value.clone())),
            };
            let name = response_name(&buf[h.name.clone()]);
            if let (Ok(name), Ok(value)) = (name, value) {
                headers.append(name, value);
            }
        }
        if let Some(rules) = rules {
            append_to_map(headers, rules, &self.request.vars(), &mut mapped);
        }
        if *plan != Plan::default() {
            push_plan(headers, plan, buf, resp, &mut mapped);
        }
        response
    }

    fn reverse_map<'h>(&'h self, server: &'h UpstreamServer) -> Option<ReverseMap<'h>> {
        let route = self.target.route;
        let r = &self.request;
        let host = r.req.host.as_ref().map(|h| &r.buf[h.clone()]);
        route.reverse_rewrite.then(|| ReverseMap {
            upstream_authority: server.name.as_bytes(),
            public_authority: host,
            upstream_prefix: route
                .rewrite_prefix
                .as_deref()
                .unwrap_or(&route.path_prefix),
            public_prefix: &route.path_prefix,
        })
    }
}

fn is_location(kind: crate::codec::http1::HeaderKind) -> bool {
    use crate::codec::http1::HeaderKind::*;
    matches!(kind, Location | ContentLocation | Uri)
}

/// Adds a compression plan's fields (`content-encoding`, the weakened `etag`, `vary`).
fn push_plan(
    headers: &mut http::HeaderMap,
    plan: &Plan,
    buf: &[u8],
    resp: &ResponseHead,
    scratch: &mut Vec<u8>,
) {
    if let Some(e) = plan.encoding {
        headers.append(
            http::header::CONTENT_ENCODING,
            http::HeaderValue::from_static(e.token()),
        );
    }
    if let Some(etag) = compression::etag(buf, &resp.headers).filter(|_| plan.weak_etag) {
        scratch.clear();
        compression::push_weak(scratch, etag);
        if let Ok(v) = http::HeaderValue::from_bytes(scratch) {
            headers.append(http::header::ETAG, v);
        }
    }
    if plan.vary {
        headers.append(
            http::header::VARY,
            http::HeaderValue::from_static("Accept-Encoding"),
        );
    }
}

/// Compresses `data` (flushed) and sends what came out as DATA; `done`: the body ended,
/// the encoder's tail goes out, with the end of the stream when `end` (no trailers
/// follow). Returns the bytes sent.
async fn send_encoded(
    send: &mut SendStream<Bytes>,
    encoder: &mut Encoder,
    data: &[u8],
    (done, end): (bool, bool),
    timeout: Duration,
    trace: &mut Trace,
) -> Result<usize, Stop> {
    let failed = |_| Stop::Error(ProxyError::UpstreamMalformed("compressor failed"));
    if !data.is_empty() {
        encoder.feed(data).map_err(failed)?;
    }
    if done {
        encoder.finish().map_err(failed)?;
    }
    let out = encoder.output();
    if let Some(c) = trace.compressed.as_mut() {
        c.bytes_in += data.len() as u64;
        c.bytes_out += out.len() as u64;
    }
    let len = out.len();
    let sent = send_data(send, out, end, timeout).await;
    out.clear();
    sent.map(|()| len)
}

/// The value of a pool's `Set-Cookie: ...\r\n` line.
pub(super) fn cookie_value(line: &[u8]) -> Option<http::HeaderValue> {
    let value = line.splitn(2, |b| *b == b':').nth(1)?;
    let value = value.trim_ascii();
    http::HeaderValue::from_bytes(value).ok()
}

/// A failure from a stream's early end; a client reset is marked in `trace`.
fn stopped(stop: Stop, reached: Reached, trace: &mut Trace) -> Failure {
    let error = match stop {
        Stop::Reset => {
            trace.reset = true;
            ProxyError::ClientClosed
        }
        Stop::Error(e) => e,
    };
    Failure { error, reached }
}

/// Sends a stream's request over HTTP/1.1 connections: the head written for each try's
/// server, the body (if any) streamed from the stream's DATA.
struct StreamSender<'s, 'c> {
    r: &'s StreamRequest<'s>,
    x: &'s Exchange<'s>,
    body: Option<RecvStream>,
    up_buf: &'s mut Buffer,
    out: &'s mut Vec<u8>,
    resp: &'s mut ResponseHead,
    timer: &'s mut LazyTimer,
    interim: &'c ClientStream<'s>,
    /// Request body bytes taken from the client.
    body_in: &'s mut u64,
}

impl Sender for StreamSender<'_, '_> {
    /// The connection, and whether the whole request body went up.
    type Sent = (UpstreamStream, bool);

    async fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> Result<(UpstreamStream, bool), Miss> {
        let (r, x) = (self.r, self.x);
        self.out.clear();
        r.write_head(self.out, a.server);
        let listener = x.target.listener;
        let mut rd = Reading {
            up_buf: self.up_buf,
            resp: self.resp,
            timer: self.timer,
            meta: r.meta(),
            client_timeout: listener.client_timeout,
        };
        let sent = match self.body.as_mut() {
            None => (
                send_whole(x, a, self.out, &[], &mut rd, &mut self.interim).await?,
                true,
            ),
            Some(body) => {
                let (head, total) = (&*self.out, &mut *self.body_in);
                let chunked = r.request.req.framing == BodyFraming::Chunked;
                let timeouts = (listener.client_timeout, x.target.upstream.response_timeout);
                let limit = listener.max_body_size;
                let upload = async |uw: &mut WriteHalf<'_>| {
                    body::write_all(uw, head, &[], timeouts.1).await?;
                    upload(body, uw, chunked, limit, timeouts, total).await
                };
                send_streaming(x, a, &mut rd, &mut self.interim, upload).await?
            }
        };
        // No upgrade was offered (the RFC 8441 bridge has its own exchange): a final 101
        // is the server's error, and h2 could not send it.
        if self.resp.status == 101 {
            return Err(ProxyError::UpstreamMalformed("101 without an upgrade request").into());
        }
        match tries.relays(self.resp.status, self.replayable(), self.responded()) {
            true => Ok(sent),
            false => Err(Miss::retried(self.resp.status)),
        }
    }

    fn replayable(&self) -> bool {
        self.body.is_none()
    }

    fn responded(&self) -> bool {
        self.r.relayed.any()
    }
}

/// Writes the request's DATA upstream (chunk-framed when `chunked`), releasing each
/// piece's flow-control capacity only once the upstream took it. `timeouts`: for the
/// client's next DATA, and for each write upstream.
async fn upload<W: AsyncWrite + Unpin>(
    body: &mut RecvStream,
    up: &mut W,
    chunked: bool,
    limit: Option<u64>,
    timeouts: (Duration, Duration),
    total: &mut u64,
) -> Result<(), PumpError> {
    let (client_timeout, upstream_timeout) = timeouts;
    let mut chunks = body::Chunks::default();
    loop {
        let data = match with_timeout(client_timeout, body.data()).await {
            Err(_) => return Err(PumpError::ReadTimeout),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(PumpError::Read(std::io::ErrorKind::ConnectionReset)),
            Ok(Some(Ok(data))) => data,
        };
        *total += data.len() as u64;
        if limit.is_some_and(|max| *total > max) {
            return Err(PumpError::TooLarge);
        }
        if data.is_empty() {
            continue;
        }
        // Each write is flushed: a TLS upstream may hold the last records back when its
        // socket was full, and nothing else would send them (the upstream would wait for
        // them, the client for the answer); plain TCP returns at once (no system call).
        // Chunked: the size line (with the CRLF owed to the previous chunk) and the data
        // in one `writev`.
        let prefix: &[u8] = if chunked {
            chunks.prefix(data.len())
        } else {
            &[]
        };
        body::write_all(up, prefix, &data, upstream_timeout).await?;
        // Only now may the client send more: its pace is the upstream's.
        let _ = body.flow_control().release_capacity(data.len());
    }
    if chunked {
        // Trailers (if any) are dropped: an HTTP/1.1 upstream gets none from h2 clients.
        body::write_all(up, chunks.last(), b"\r\n", upstream_timeout).await?;
    }
    Ok(())
}

/// What `respond_with` relays besides the head: the compression plan (`Plan::default()`:
/// as is) and the body bytes that arrived with the head, when they can be sent as they are.
pub(super) struct ResponseBody<'p> {
    pub plan: &'p Plan,
    pub first: Option<Bytes>,
}

#[cfg(test)]
mod tests {
    use super::super::test_io::{request_body, Holding};
    use super::Trace;
    use std::time::Duration;

    /// Uploads a request body of two DATA frames to a [`Holding`] writer; returns
    /// (held, sent) once the upload returned.
    async fn upload_to_holding(chunked: bool) -> (usize, usize) {
        let mut body = request_body(&[b"hello", b"world"], true).await;
        let mut up = Holding::default();
        let timeouts = (Duration::from_secs(10), Duration::from_secs(10));
        let mut total = 0;
        super::upload(&mut body, &mut up, chunked, None, timeouts, &mut total)
            .await
            .expect("uploaded");
        assert_eq!(total, 10);
        (up.0.held.get(), up.0.sent.get())
    }

    /// Nothing of an upload stays unflushed once it returns: over TLS, an unflushed tail
    /// stayed in rustls when the upstream's socket was full, with the upstream waiting.
    #[tokio::test]
    async fn an_upload_leaves_nothing_unflushed() {
        assert_eq!(upload_to_holding(false).await, (0, 10));
        let framed = "5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n".len();
        assert_eq!(upload_to_holding(true).await, (0, framed));
    }

    #[test]
    fn grpc_status_is_digits_only_and_noted_once_sent() {
        let status = |grpc: bool, value: &str| {
            let mut fields = http::HeaderMap::new();
            let value = http::HeaderValue::from_str(value).ok()?;
            fields.insert("grpc-status", value);
            Trace {
                grpc,
                ..Trace::default()
            }
            .grpc_status_in(&fields)
        };
        assert_eq!(status(true, "0"), Some(0));
        assert_eq!(status(true, "14"), Some(14));
        for bad in ["+5", "-1", " 5", "5 ", "", "x", "99999999999"] {
            assert_eq!(status(true, bad), None, "{bad:?}");
        }
        assert_eq!(status(false, "5"), None);
        let mut trace = Trace::default();
        trace.sent_grpc_status(Some(3));
        trace.sent_grpc_status(None);
        assert_eq!(trace.grpc_status, Some(3));
    }
}
