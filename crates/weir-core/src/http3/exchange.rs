//! One HTTP/3 stream's exchange with an HTTP/1.1 upstream server: the driver's tries
//! (`forward::driver`) over `forward::h1`, as for HTTP/1.x and HTTP/2 clients, with the
//! stream's halves as the client side: the request sent by the HTTP/2 stream's sender
//! (`http2::exchange::StreamSender`) with the body from its DATA ([`H3Source`]), the
//! response relayed as to an HTTP/2 stream (`StreamRequest::respond_accepted`: the same
//! head and body, into the stream's `ResponseStream`, `http3::body`). A client whose
//! connection closes during the tries cancels them at once.

use std::cell::Cell;

use super::body::{H3Source, RecvHalf};
use super::interim::H3Interim;
use super::send::H3Responder;
use crate::buffer::Buffer;
use crate::error::ProxyError;
use crate::forward::driver::drive;
use crate::forward::Failure;
use crate::http2::exchange::{StreamRequest, StreamSender};
use crate::request::Trace;
use bytes::Bytes;

/// The request body of a stream: its halves' receiving one, and a payload already read.
pub(crate) struct Body<'b> {
    pub recv: &'b mut RecvHalf,
    pub first: Option<Bytes>,
    /// The request's `content-length`, which the DATA must match.
    pub length: Option<u64>,
}

/// Forwards the stream's request `r` to an HTTP/1.1 upstream and relays the response
/// into the stream `to`. On `Err` with `Reached::Nothing` the
/// caller answers.
pub(crate) async fn forward(
    r: &StreamRequest<'_>,
    body: Option<Body<'_>>,
    to: &mut H3Responder<'_>,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let worker = r.worker;
    let mut up_buf = worker.take_buffer();
    let mut scratch = worker.h2_scratch.exchanges.take();
    let result = exchange(r, body, to, &mut up_buf, &mut scratch, trace).await;
    worker.h2_scratch.exchanges.give(scratch);
    worker.give_buffer(up_buf);
    result
}

async fn exchange(
    r: &StreamRequest<'_>,
    body: Option<Body<'_>>,
    to: &mut H3Responder<'_>,
    up_buf: &mut Buffer,
    scratch: &mut crate::http2::scratch::ExchangeScratch,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let crate::http2::scratch::ExchangeScratch { out, resp, timer } = scratch;
    let x = r.exchange_of();
    let body_in = Cell::new(0);
    let listener = r.target.listener;
    let source = body.map(|body| H3Source {
        body: body.recv,
        first: body.first,
        timeout: listener.client_timeout,
        pace: (listener.min_body_rate.filter(|_| !trace.grpc)).map(crate::time::Pace::new),
        total: &body_in,
        limit: listener.max_body_size,
        length: body.length,
    });
    // The 1xx heads that come before the final one go to the client (`interim`).
    let shared = Cell::new(Some(&mut *to.send));
    let interim = H3Interim::of(&shared, r);
    let mut sender = StreamSender {
        r,
        body: source,
        up_buf: &mut *up_buf,
        out,
        resp: &mut *resp,
        timer,
        interim,
        websocket_key: None,
    };
    let accepted = {
        let started = r.request.started;
        let driving = std::pin::pin!(drive(&x, &mut sender, started, &mut trace.last_try));
        // A client whose connection closes while the head is awaited (it left, idled out,
        // or a budget closed it) cancels the upstream request at once, as toward an HTTP/2
        // upstream (`upstream::H3Client::gone`), not at the response timeout.
        tokio::select! {
            biased;
            accepted = driving => accepted,
            _ = to.quic.closed() => Err(Failure::from(ProxyError::ClientClosed)),
        }
    };
    drop(sender);
    trace.body_in = body_in.get();
    r.respond_accepted(accepted?, to.send, up_buf, resp, trace)
        .await
}
