//! An HTTP/1.x client's request to its upstream: over the side `forward::carrier` says (an
//! HTTP/1.1 connection: `forward::exchange`; an HTTP/2 stream: `http2::from_http1`, the
//! HTTP/1.x client's side of `http2::upstream`, the sender every client protocol shares
//! toward HTTP/2 upstreams), and a route cache's miss
//! around it ([`forward_filling`]). Here, above both, so that `forward/` needs nothing of
//! `http2/`.

use std::mem::take;

use crate::cache::{CacheResult, Fill};
use crate::client::ClientConn;
use crate::codec::http1::{RequestHead, ResponseHead};
use crate::files::{respond_http1, send_http1, Under};
use crate::forward::exchange::{exchange, forward_h1, request_meta};
use crate::forward::filling::stale_answer;
use crate::forward::request_head::render_response_rules;
use crate::forward::{carrier, Carrier, Failure, Target};
use crate::metrics::shard::Protocol;
use crate::worker::Worker;

/// Forwards the request whose head is at the start of `conn.buf`, over the upstream side
/// `forward::carrier` says. `keep_alive`: the client connection may stay open afterwards.
/// Returns whether it does. `target` by reference: by value, the caller's state machine
/// built this future's first 208 bytes on its stack and copied them into place twice
/// (two `memcpy` calls per proxied request, about 55 instructions, `bench/instructions.sh`).
pub(crate) async fn forward(
    worker: &Worker,
    target: &Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
) -> Result<bool, Failure> {
    // Shared with `conn` (its head writers read the attempt's span from it).
    let trace = conn.trace.clone();
    // An upgrade toward an HTTP/2-only upstream goes to the HTTP/2 sender too, which
    // refuses it with 501 (`forward::tunnels_to`).
    let over_http1 = carrier(Protocol::Http1, target.upstream) == Carrier::Http1;
    // What the HTTP/1.1 side's tries share, made before the client is borrowed for them;
    // the HTTP/2 sender makes its own (`drive_h2`), so the request's balancing key is
    // read (hashed, for `consistent_hash`) once either way.
    let x = over_http1.then(|| exchange(worker, *target, conn, req, trace.as_deref()));
    let meta = request_meta(target.route, target.listener, conn.buf.filled(), req);
    match &x {
        Some(x) => forward_h1(x, conn, req, resp, meta, keep_alive).await,
        // Boxed, as an HTTP/2 client's stream boxes it (`http2::stream`): its state is
        // about twice an HTTP/1.1 upstream's, and every request's future would hold it.
        None => {
            let to_h2 = crate::http2::from_http1::forward_h2;
            Box::pin(to_h2(worker, *target, conn, req, resp, meta, keep_alive)).await
        }
    }
}

/// [`forward`] for a route cache's miss (`fill`): answered by the entry another request
/// fetching the same key stores, if it may; else forwarded with the fill in `conn.fill`,
/// where the exchange finds it (its conditional lines, the response it stores or answers
/// for), and dropped once the exchange is over.
pub(crate) async fn forward_filling(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
    mut fill: Box<Fill>,
) -> Result<bool, Failure> {
    conn.current.exchange.cache = Some(CacheResult::Miss);
    let under = Under::of_target(&target);
    if let Some(reply) = fill.collapse().await {
        conn.current.read = true;
        return respond_http1(conn, req, under, reply, keep_alive, resp).await;
    }
    // Rendered now, while the request is at hand: an answer from the store after a
    // failure may come before any try rendered them.
    let mut lines = take(&mut conn.resp_lines);
    render_response_rules(&mut lines, &conn.request(req), &conn.path, target.route);
    conn.resp_lines = lines;
    // Made now, while the request is at hand: how a stale answer would go.
    let meta = request_meta(target.route, target.listener, conn.buf.filled(), req);
    conn.fill = Some(fill);
    let result = forward(worker, &target, conn, req, resp, keep_alive).await;
    // A miss that failed before any of the response was sent: its stale entry may answer
    // for the failure (`stale-if-error`, `serve_stale_on`); else the failure stands.
    // The fill (its key's lock) is held until the stale answer is sent: requests waiting
    // for the key wake to what the leader got, not before.
    let fill = conn.fill.take();
    let Some(reply) = stale_answer(fill.as_deref(), &result) else {
        return result;
    };
    let (under, keep_alive) = (Under::of_target(&target), keep_alive && conn.current.read);
    send_http1(conn, under, reply, meta, keep_alive, resp).await
}
