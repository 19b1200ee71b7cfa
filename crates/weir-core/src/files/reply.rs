//! Sending a reply to an HTTP/1.x client, as an upstream's response is sent
//! (`forward::exchange`): the head through the route's `forward::head::Edits`
//! (`response_headers`, the compression plan) by `write_from_http1`, the body through
//! `forward::relay` into the client's `Http1Sink`; a plain-TCP body of one range past
//! `sendfile_min_size`, not compressed, with sendfile(2) instead. The HTTP/2 side is
//! `http2::files`, from the same head and body.

use std::future::poll_fn;
use std::os::fd::AsFd;

use weir_config::{Listener, Route};

use super::body::BodySource;
use super::Reply;
use crate::client::ClientConn;
use crate::codec::http1::{parse_response, RequestHead, ResponseHead};
use crate::error::ProxyError;
use crate::filters::compression::Plan;
use crate::forward::body::{self, BodyState};
use crate::forward::exchange::request_meta;
use crate::forward::h1::RequestMeta;
use crate::forward::head::{coding, write_from_http1, ClientFraming, Edits};
use crate::forward::relay::{relay, Broke, Http1Sink, Peer};
use crate::forward::request_head::render_response_rules;
use crate::forward::Failure;
use crate::time::with_timeout;

/// The route and listener a reply is sent under.
#[derive(Clone, Copy)]
pub(crate) struct Under<'a> {
    pub route: &'a Route,
    pub listener: &'a Listener,
}

impl<'a> Under<'a> {
    /// Route `route` of `listener` (the route a `Decision::Reply` names).
    pub fn of(listener: &'a Listener, route: Option<usize>) -> Under<'a> {
        let route = &listener.routes[route.unwrap_or_default()];
        Under { route, listener }
    }

    /// The route and listener of a forwarded request.
    pub fn of_target(target: &crate::forward::Target<'a>) -> Under<'a> {
        Under {
            route: target.route,
            listener: target.listener,
        }
    }
}

/// Sends `reply` to the HTTP/1.x client of `conn` for the request `req` (its head at the
/// start of `conn.buf`); `resp` is set to the reply's head. Returns whether the
/// connection stays open (as for Weir's answers: a request body not all in the buffer
/// closes it).
pub(crate) async fn respond_http1(
    conn: &mut ClientConn,
    req: &RequestHead,
    under: Under<'_>,
    reply: Reply,
    keep_alive: bool,
    resp: &mut ResponseHead,
) -> Result<bool, Failure> {
    let Under { route, listener } = under;
    let mut body = BodyState::new(req.framing, false, listener.max_body_size);
    let (_, consumed) = body
        .take(&mut conn.buf.filled_mut()[req.head_len..])
        .map_err(|_| ProxyError::BadRequest("malformed body"))?;
    let meta = request_meta(route, listener, conn.buf.filled(), req);
    let mut lines = std::mem::take(&mut conn.resp_lines);
    render_response_rules(&mut lines, &conn.request(req), &conn.path, route);
    conn.resp_lines = lines;
    conn.buf.consume(req.head_len + consumed);
    send_http1(conn, under, reply, meta, keep_alive && body.is_done(), resp).await
}

/// Sends `reply` to the HTTP/1.x client of `conn` (its request consumed, the route's
/// `response_headers` rendered in `conn.resp_lines`; `meta`, what is remembered of the
/// request); `resp` is set to the reply's head. `keep_alive`: the connection stays open
/// after it; returned.
pub(crate) async fn send_http1(
    conn: &mut ClientConn,
    under: Under<'_>,
    reply: Reply,
    to: RequestMeta,
    keep_alive: bool,
    resp: &mut ResponseHead,
) -> Result<bool, Failure> {
    let head = &reply.head[..];
    // Weir wrote this head itself: it always parses.
    if !parse_response(head, head.len(), to.is_head, resp)? {
        return Err(ProxyError::UpstreamMalformed("incomplete reply head").into());
    }
    if reply.cache.is_some() {
        conn.current.exchange.cache = reply.cache;
    }
    let route = under.route;
    let lines = std::mem::take(&mut conn.resp_lines);
    let rules = route.filters.response_headers.as_ref();
    let edits = Edits {
        rules: rules.map(|r| (r, &lines[..])),
        plan: reply.plan(route, head, resp, to.is_head, to.accepted),
        ..Edits::default()
    };
    let framing = ClientFraming {
        dechunk: false,
        close: !keep_alive,
        http10: to.http10,
    };
    let mut out = std::mem::take(&mut conn.out);
    out.clear();
    write_from_http1(&mut out, head, resp, &edits, &framing);
    let sent = send_body(conn, &out, &reply, &edits.plan, under).await;
    (conn.out, conn.resp_lines) = (out, lines);
    sent.map_err(Failure::after_head)?;
    Ok(keep_alive)
}

/// Writes `head` and the reply's body: with sendfile(2) when it can, else relayed
/// (compressed when `plan` says so).
async fn send_body(
    conn: &mut ClientConn,
    head: &[u8],
    reply: &Reply,
    plan: &Plan,
    under: Under<'_>,
) -> Result<(), ProxyError> {
    let timeout = under.listener.client_timeout;
    let plain = plan.encoding.is_none() && conn.stream.tls().is_none();
    let single = reply.body.single_range();
    let in_file = single.and_then(|(file, first, end)| Some((file?, first, end)));
    if let Some((file, first, end)) =
        in_file.filter(|(_, f, e)| plain && e - f >= reply.sendfile_min_size)
    {
        let written = body::write_parts(&mut conn.stream, [head], timeout).await;
        written.map_err(|e| Peer::Client.error(e))?;
        conn.sent += head.len() as u64;
        return sendfile(conn, file.as_fd(), first..end, timeout).await;
    }
    let length = single.map(|(_, first, end)| end - first);
    let mut coding = coding(under.route, plan, length)?;
    let mut source = BodySource::new(&reply.body);
    let mut sink = Http1Sink {
        writer: &mut conn.stream,
        timeout,
        sent: &mut conn.sent,
        head,
        chunked: plan.encoding.is_some(),
        trailers: None,
    };
    let relayed = relay(&mut source, &mut sink, coding.as_mut()).await;
    conn.current.exchange.compressed = coding.as_ref().map(|c| c.counts);
    relayed.map_err(|(Broke::Source(e) | Broke::Sink(e))| e)
}

/// Sends the file's bytes `range` to the client socket with sendfile(2), each call
/// within the listener's `client_timeout`.
async fn sendfile(
    conn: &mut ClientConn,
    file: std::os::fd::BorrowedFd<'_>,
    range: std::ops::Range<u64>,
    timeout: std::time::Duration,
) -> Result<(), ProxyError> {
    let mut offset = range.start as i64;
    while (offset as u64) < range.end {
        // At most 1 GiB per call (Linux sends at most 2 GiB - 4 KiB anyway).
        let want = (range.end - offset as u64).min(1 << 30) as usize;
        let call = poll_fn(|cx| conn.stream.poll_sendfile(cx, file, &mut offset, want));
        let sent = match with_timeout(timeout, call).await {
            Err(_) => return Err(ProxyError::ClientTimeout),
            Ok(Err(e)) => return Err(ProxyError::client_io(e)),
            // The file shrank under the reply: the response is cut short.
            Ok(Ok(0)) => return Err(ProxyError::UpstreamIo(std::io::ErrorKind::UnexpectedEof)),
            Ok(Ok(n)) => n,
        };
        conn.sent += sent as u64;
    }
    Ok(())
}
