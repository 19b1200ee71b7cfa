//! One HTTP/3 stream's exchange with an HTTP/1.1 upstream server: the driver's tries
//! (`forward::driver`) over `forward::h1`, as for HTTP/1.x and HTTP/2 clients, with the
//! stream's halves as the client side: the request sent by the HTTP/2 stream's sender
//! (`http2::exchange::StreamSender`) with the body from its DATA ([`H3Source`]),
//! the response head with the route's edits (`http2::respond::head_from_http1`, the same
//! fields an HTTP/2 client gets) and its body relayed into the stream ([`H3Sink`]).

use std::cell::Cell;
use std::time::Instant;

use super::body::{H3Sink, H3Source, RecvHalf, SendHalf};
use super::interim::H3Interim;
use crate::buffer::Buffer;
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::connector::UpstreamStream;
use crate::error::ProxyError;
use crate::forward::body::BodyState;
use crate::forward::driver::drive;
use crate::forward::filling::relay_recorded;
use crate::forward::h1::{pool_after_answer, reuse};
use crate::forward::head::{coding, plan_http1};
use crate::forward::relay::{at_hand, Broke, Coding, Http1Source, Peer, Piece, Sink, Source};
use crate::forward::{Failure, Reached};
use crate::http2::exchange::{StreamRequest, StreamSender, Trace};
use crate::http2::files::respond_stream;
use crate::http2::respond::head_from_http1;
use crate::request::LastTry;
use bytes::Bytes;

/// The request body of a stream: its halves' receiving one, and a payload already read.
pub(crate) struct Body<'b> {
    pub recv: &'b mut RecvHalf,
    pub first: Option<Bytes>,
    /// The request's `content-length`, which the DATA must match.
    pub length: Option<u64>,
}

/// Forwards the stream's request `r` to an HTTP/1.1 upstream and relays the response
/// into `send`. On `Err` with `Reached::Nothing` the caller answers.
pub(crate) async fn forward(
    r: &StreamRequest<'_>,
    body: Option<Body<'_>>,
    send: &mut SendHalf,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let worker = r.worker;
    let mut up_buf = worker.take_buffer();
    let mut scratch = worker.h2_scratch.take_exchange();
    let result = exchange(r, body, send, &mut up_buf, &mut scratch, trace).await;
    worker.h2_scratch.give_exchange(scratch);
    worker.give_buffer(up_buf);
    result
}

async fn exchange(
    r: &StreamRequest<'_>,
    body: Option<Body<'_>>,
    send: &mut SendHalf,
    up_buf: &mut Buffer,
    scratch: &mut crate::http2::scratch::ExchangeScratch,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let crate::http2::scratch::ExchangeScratch { out, resp, timer } = scratch;
    let x = r.exchange_of();
    let mut last_try = LastTry::default();
    let body_in = Cell::new(0);
    let listener = r.target.listener;
    let source = body.map(|body| H3Source {
        body: body.recv,
        first: body.first,
        timeout: listener.client_timeout,
        total: &body_in,
        limit: listener.max_body_size,
        length: body.length,
    });
    // The 1xx heads that come before the final one go to the client (`interim`).
    let shared = Cell::new(Some(&mut *send));
    let interim = H3Interim::of(&shared, r);
    let mut sender = StreamSender {
        r,
        x: &x,
        body: source,
        up_buf: &mut *up_buf,
        out,
        resp: &mut *resp,
        timer,
        interim,
    };
    let accepted = drive(&x, &mut sender, r.request.started, &mut last_try).await;
    drop(sender);
    trace.upstream_pick = last_try.upstream_pick;
    trace.upstream_time = last_try.upstream_time;
    trace.body_in = body_in.get();
    let ((mut stream, request_done), accepted) = accepted?.take();
    if let Some(reply) = r.answer_instead((up_buf, resp), &accepted) {
        pool_after_answer(&x, &accepted, (up_buf, resp), (stream, request_done));
        let under = crate::files::Under::of_target(&r.target);
        return Box::pin(respond_stream(send, &r.request, under, reply, trace)).await;
    }
    let mut lines = Vec::new();
    let mut edits = r.edits(&mut lines, accepted.server);
    edits.cookie = accepted.set_cookie();
    let count = |result| accepted.count(result);
    let up = Upstream {
        stream: &mut stream,
        buf: up_buf,
        head: resp,
    };
    let body_with_head = respond(r, send, up, edits, count, trace).await?;
    let reusable = resp.keeps_alive() && request_done && up_buf.is_empty();
    if reusable && !(r.request.req.is_head && resp.framing == BodyFraming::UntilClose) {
        let since = match body_with_head {
            true => accepted.head_at,
            false => Instant::now(),
        };
        reuse(&x, accepted.server, accepted.metrics, stream, since);
    }
    Ok(())
}

/// An HTTP/1.1 upstream's response: its head (parsed from `buf`) and its connection.
struct Upstream<'u> {
    stream: &'u mut UpstreamStream,
    buf: &'u mut Buffer,
    head: &'u ResponseHead,
}

const COMPRESSOR_FAILED: ProxyError = ProxyError::UpstreamMalformed("compressor failed");

/// Sends the upstream's response `up` into the stream: the head with `edits` (the
/// compression plan made here), then the body and its trailers. The try is counted once
/// with `count`. Returns whether the whole body came with the head.
async fn respond(
    r: &StreamRequest<'_>,
    send: &mut SendHalf,
    up: Upstream<'_>,
    mut edits: crate::forward::head::Edits<'_>,
    count: impl FnOnce(Result<u16, ProxyError>),
    trace: &mut Trace,
) -> Result<bool, Failure> {
    let (resp, route) = (up.head, r.target.route);
    let arrived = r.worker.h2_scratch.copy(up.buf.filled());
    let is_head = r.request.req.is_head;
    edits.plan = plan_http1(route, up.buf.filled(), resp, is_head, r.accepted());
    let mut head = head_from_http1(resp, &arrived, &edits, http::HeaderMap::new());
    let mut recorder = r.admit(up.buf.filled(), resp, &mut head);
    up.buf.consume(resp.head_len);
    let at_hand = at_hand(edits.plan.encoding, resp, up.buf);
    let state = BodyState::new(resp.framing, true, None).keeping_trailers();
    let empty = is_head || state.is_done();
    let timeout = r.target.upstream.response_timeout;
    let mut source = Http1Source::new(up.stream, up.buf, state, timeout, Peer::Upstream);
    source.first = (resp.framing != BodyFraming::Chunked).then(|| arrived.slice(resp.head_len..));
    let ready = coding(route, &edits.plan, resp.framing.length()).map_err(|_| COMPRESSOR_FAILED);
    let ready = ready.and_then(|c| Ok((c, empty || at_hand.is_some() || source.prime()?)));
    let (mut coding, body_with_head) = match ready {
        Ok(ready) => ready,
        Err(e) => {
            count(Err(e));
            return Err(e.into());
        }
    };
    count(Ok(resp.status));
    trace.status = resp.status;
    let grpc_status = trace.grpc_status_in(head.headers());
    let listener = r.target.listener;
    send.send_head(head, listener.http2.stall_timeout)
        .await
        .map_err(Failure::after_head)?;
    trace.sent_grpc_status(grpc_status);
    let mut sink = H3Sink {
        send,
        stall: listener.http2.stall_timeout,
        max_trailers: listener.http2.max_header_list_size,
        edits: &edits,
        trace: &mut *trace,
    };
    let relayed = match (empty, at_hand) {
        (true, _) => sink
            .data(Piece::Slice(&[]), true)
            .await
            .map_err(Broke::Sink),
        (false, Some(n)) => {
            let at = resp.head_len;
            let whole = arrived.slice(at..at + n);
            if let Some(recorder) = recorder.as_mut() {
                recorder.record(&whole);
            }
            let sent = sink
                .data(Piece::Bytes(whole), true)
                .await
                .map_err(Broke::Sink);
            source.buf.consume(n);
            sent
        }
        (false, None) => {
            let recording = recorder.as_mut();
            relay_recorded(&mut source, &mut sink, coding.as_mut(), recording).await
        }
    };
    trace.compressed = coding.as_ref().map(Coding::compressed);
    if let Err(Broke::Source(error) | Broke::Sink(error)) = relayed {
        send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
        let reached = Reached::Head;
        return Err(Failure { error, reached });
    }
    if let Some(recorder) = recorder {
        recorder.finish();
    }
    Ok(body_with_head)
}
