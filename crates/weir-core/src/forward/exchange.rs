//! An HTTP/1.x client's request to an HTTP/1.1 upstream, in the order it happens on the
//! wire.
//!
//! [`exchange`] and [`request_meta`] (called by `proxy::forward`) prepare the request once (the body already buffered, the coding the client
//! accepts, the client's `Host` for the response's locations); the driver
//! (`forward::driver`) sends it through [`Http1Sender`] (over `forward::h1`: the head and
//! the whole body in one write, or the body streamed while the response head is awaited);
//! the accepted try becomes a [`Response`], which relays the response.

use std::mem::take;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use super::body::{self, BodyState};
use super::driver::{drive, Accepted, Attempt, Exchange, Miss, Sender, Tries};
use super::h1::{send_streaming, send_whole, Http1Interim, Http1Response, Reading, RequestMeta};
use super::head::{coding, plan_http1, write_from_http1, ClientFraming, Edits};
use super::relay::{
    at_hand, relay, Broke, Dropped, Http1Sink, Http1Source, Peer, Piece, Recording, Sink,
};
use super::request_head::{render_response_rules, write_upstream_head};
use super::trailer::{self, request_drops};
use super::{tunnel, Failure, Target, Timeouts};
use crate::buffer::Buffer;
use crate::cache::{Fetched, Fill, Recorder};
use crate::client::ClientConn;
use crate::codec::http1::{BodyFraming, RequestHead, ResponseHead};
use crate::connector::{UpstreamStream, WriteHalf};
use crate::error::ProxyError;
use crate::files::{send_http1, Under};
use crate::filters::compression::{self, Plan};
use crate::filters::upgrade::{switch_allowed, Offered};
use crate::otel::RequestTrace;
use crate::time::Continued;
use crate::upstream::RequestKey;
use crate::worker::Worker;
use weir_config::{Listener, Route, UpstreamServer};

/// What every try of `req` shares.
#[inline]
pub(crate) fn exchange<'a>(
    worker: &'a Worker,
    target: Target<'a>,
    conn: &mut ClientConn,
    req: &RequestHead,
    trace: Option<&'a RequestTrace>,
) -> Exchange<'a> {
    let buf = conn.buf.filled();
    // Kept for the response's locations, which only `reverse_rewrite` reads (`Edits::of`):
    // the head is consumed by then. Without it, no copy (a `memcpy` call per request).
    if target.route.reverse_rewrite {
        conn.host.clear();
        if let Some(host) = &req.host {
            conn.host.extend_from_slice(&buf[host.clone()]);
        }
    }
    let path = conn.path.get(req.path(buf));
    Exchange {
        worker,
        target,
        key: RequestKey::new(&target.upstream.lb, buf, req, path, conn.client_text()),
        idempotent: req.idempotent,
        trace,
    }
}

/// What the exchange (or a reply from the store, `files`) remembers of the request whose
/// head is in `buf`, on a `route` of `listener`.
pub(crate) fn request_meta(
    route: &Route,
    listener: &Listener,
    buf: &[u8],
    req: &RequestHead,
) -> RequestMeta {
    let http10 = req.minor_version == 0;
    RequestMeta {
        is_head: req.is_head,
        http10,
        upgrade: Default::default(),
        // HTTP/1.0 clients get identity: a compressed body has no length to announce,
        // and ending it by closing costs the connection.
        accepted: route
            .filters
            .compression
            .as_ref()
            .filter(|_| !http10)
            .and_then(|c| compression::negotiate(c, buf, &req.headers)),
        max_informational: listener.max_informational,
    }
}

/// Adds a cache's `lines` (CRLF included; none: nothing) to the head in `out`, before the
/// blank line that ends it: the conditional fields revalidating a stale entry, a response's
/// `Cache-Status`.
pub(crate) fn push_before_end(out: &mut Vec<u8>, lines: &[u8]) {
    if !lines.is_empty() {
        out.truncate(out.len() - 2);
        out.extend_from_slice(lines);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the upstream head of `req` (at the start of `conn.buf`) for `server` into
/// `conn.out` (with a cache miss's conditional lines) and renders the route's
/// `response_headers` into `conn.resp_lines`, for every try. Returns the upgrade offered.
fn write_heads(
    conn: &mut ClientConn,
    req: &RequestHead,
    target: &Target<'_>,
    server: &UpstreamServer,
) -> Offered {
    let (mut out, mut lines) = (take(&mut conn.out), take(&mut conn.resp_lines));
    out.clear();
    let request = conn.request(req);
    let offered = write_upstream_head(&mut out, &request, &conn.path, target, server);
    if let Some(fill) = &conn.fill {
        push_before_end(&mut out, fill.conditional_lines());
    }
    render_response_rules(&mut lines, &request, &conn.path, target.route);
    (conn.out, conn.resp_lines) = (out, lines);
    offered
}

/// Forwards the request whose head `req` is at the start of `conn.buf` over HTTP/1.1
/// connections (the tries of `x`), and relays the response (its head read into `resp`;
/// `meta`: what the exchange remembers of the request). `keep_alive`: the client
/// connection may stay open after the response. Returns whether it does.
pub(crate) async fn forward_h1(
    x: &Exchange<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    meta: RequestMeta,
    keep_alive: bool,
) -> Result<bool, Failure> {
    let taken = take_buffered(x, req, conn.buf.filled_mut());
    let (body, buffered, used) = taken.map_err(|e| Peer::Client.error(e))?;
    let whole = body.is_done();
    let mut sender = Http1Sender {
        conn,
        req,
        body,
        buffered,
        used,
        whole,
        consumed: false,
        body_read: false,
        informed: false,
        up_buf: x.worker.take_buffer(),
        resp,
        meta,
    };
    let mut last_try = sender.conn.current.exchange.last_try;
    let started = sender.conn.current.started;
    let accepted = drive(x, &mut sender, started, &mut last_try).await;
    let conn = &mut *sender.conn;
    conn.current.exchange.last_try = last_try;
    // The request (the body too, when it was whole) is consumed once it is answered, or
    // failed: read whole, the connection may go on after Weir's answer.
    if !sender.consumed {
        conn.buf
            .consume(req.head_len + if whole { used } else { 0 });
    }
    conn.current.read = whole || sender.body_read;
    let result = match accepted {
        Ok(((stream, request_done), accepted)) => {
            let response = Response {
                x,
                accepted: &accepted,
                meta: sender.meta,
                request_done,
                keep_alive: keep_alive && request_done,
            };
            let fill = conn.fill.take();
            let (up_buf, resp) = (&mut sender.up_buf, &mut *sender.resp);
            response.respond(conn, stream, up_buf, resp, fill).await
        }
        // A cache's fill stays in `conn.fill`: `forward` weighs its stale entry.
        Err(failure) => Err(failure),
    };
    x.worker.give_buffer(sender.up_buf);
    result
}

/// Frames the body bytes after the head `req` in `buf` (the head at its start): the
/// body's state, the bytes to send (`buffered`) and those it took (`used`), as
/// [`Http1Sender`] keeps them. Only a chunked body has trailers: any other is framed as
/// it always was, at no cost for them.
#[inline]
fn take_buffered(
    x: &Exchange<'_>,
    req: &RequestHead,
    buf: &mut [u8],
) -> Result<(BodyState, usize, usize), body::PumpError> {
    let limit = x.target.listener.max_body_size;
    if req.framing != BodyFraming::Chunked {
        let mut body = BodyState::new(req.framing, false, limit);
        let (buffered, used) = body.take(&mut buf[req.head_len..])?;
        return Ok((body, buffered, used));
    }
    take_chunked(x, req, buf, limit)
}

/// [`take_buffered`] for a chunked body: its trailer section is kept, and goes up
/// re-written (`forward::trailer`: less the names the head does not carry), here when
/// it is all in `buf`, else by the upload's sink.
#[inline(never)]
fn take_chunked(
    x: &Exchange<'_>,
    req: &RequestHead,
    buf: &mut [u8],
    limit: Option<u64>,
) -> Result<(BodyState, usize, usize), body::PumpError> {
    let mut body = BodyState::new(BodyFraming::Chunked, false, limit).keeping_trailers();
    let (head, after_head) = buf.split_at_mut(req.head_len);
    let (forward, used) = body.take(after_head)?;
    if body.trailers().is_empty() {
        return Ok((body, forward, used));
    }
    let dropped = request_drops(x, head, req);
    let buffered = body.rewrite_trailers(&mut after_head[..used], forward, dropped)?;
    Ok((body, buffered, used))
}

/// Sends an HTTP/1.x client's request over HTTP/1.1 connections: the head written for
/// each try's server, and the body as it came.
struct Http1Sender<'c> {
    conn: &'c mut ClientConn,
    req: &'c RequestHead,
    body: BodyState,
    /// Body bytes after the head in the buffer to send (framing included; a trailer
    /// section re-written, or left to the relay when the body is not all there).
    buffered: usize,
    /// The buffer's bytes the body took (`buffered`'s, and a trailer section's).
    used: usize,
    /// The whole body is in the buffer (kept until a response is accepted).
    whole: bool,
    /// The head and the buffered body were consumed (a streamed upload began).
    consumed: bool,
    /// A streamed upload took the whole body from the client.
    body_read: bool,
    /// The client has a relayed 1xx head: no other server then.
    informed: bool,
    up_buf: Buffer,
    resp: &'c mut ResponseHead,
    meta: RequestMeta,
}

impl Sender for Http1Sender<'_> {
    /// The connection, and whether the whole request body went up.
    type Sent = (UpstreamStream, bool);

    async fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> Result<(UpstreamStream, bool), Miss> {
        let (x, req) = (tries.x, self.req);
        let conn = &mut *self.conn;
        self.meta.upgrade = write_heads(conn, req, &x.target, a.server);
        let listener = x.target.listener;
        let mut rd = Reading {
            up_buf: &mut self.up_buf,
            resp: self.resp,
            timer: &mut conn.upstream_timer,
            meta: self.meta,
        };
        let sent = if self.whole {
            let body = &conn.buf.filled()[req.head_len..][..self.buffered];
            let mut interim = Http1Interim::new(&mut conn.stream, listener, &mut self.informed);
            send_whole(x, a, &conn.out, body, &mut rd, &mut interim).await?
        } else {
            // A streamed upload waits on the client and the upstream at once: register.
            let (mut cr, mut cw) = conn.stream.split().map_err(ProxyError::client_io)?;
            let (head, buf) = (&conn.out, &mut conn.buf);
            let state = &mut self.body;
            let (consumed, body_read) = (&mut self.consumed, &mut self.body_read);
            let (head_len, buffered, used) = (req.head_len, self.buffered, self.used);
            let timeouts = Timeouts::of(&x.target);
            // A client waiting for its 100 is not held to its pace until it has it (an
            // HTTP/1.0 client's Expect is ignored: it is sent no 1xx).
            let waits = req.expect_continue && buffered == 0 && !self.meta.http10;
            let continued = waits.then(Rc::<Continued>::default);
            let pace_continued = continued.clone();
            let upload = async |uw: &mut WriteHalf<'_>| {
                // The head, then the body as it came: its bytes already at hand with it.
                let mut uploaded = 0;
                // A chunked body's trailer fields lose what no trailer may carry and the
                // names its head did not carry (`forward::trailer`); read from the head
                // while it is in the buffer. Another body has no trailers: nothing to build.
                let chunked = req.framing == BodyFraming::Chunked;
                let dropped = chunked.then(|| request_drops(x, buf.filled(), req));
                let mut sink = Http1Sink {
                    writer: uw,
                    timeout: timeouts.upstream,
                    sent: &mut uploaded,
                    head,
                    chunked: false,
                    trailers: dropped.as_ref().map(|d| d as Dropped<'_>),
                };
                let first = Piece::Slice(&buf.filled()[head_len..head_len + buffered]);
                sink.data(first, false).await.map_err(Broke::Sink)?;
                buf.consume(head_len + used);
                *consumed = true;
                // Taken only now: a try that got no connection (a connect error, retried
                // on another server) leaves the body's state to the next try.
                let state = std::mem::replace(state, BodyState::Done);
                let mut source =
                    Http1Source::new(&mut cr, buf, state, timeouts.client, Peer::Client)
                        .paced(timeouts.min_body_rate, pace_continued.clone());
                let relayed = relay(&mut source, &mut sink, None).await;
                *body_read = relayed.is_ok();
                relayed
            };
            let mut interim = Http1Interim::new(&mut cw, listener, &mut self.informed);
            interim.continued = continued;
            // Boxed: a request without a body still arriving keeps the try's state small.
            Box::pin(send_streaming(x, a, &mut rd, &mut interim, upload)).await?
        };
        tries.relays(self.resp.status, self.whole, self.informed)?;
        Ok(sent)
    }

    fn replayable(&self) -> bool {
        self.whole
    }

    fn responded(&self) -> bool {
        self.informed
    }
}

/// The response half of an exchange: the accepted try's response relayed to the client.
struct Response<'a> {
    x: &'a Exchange<'a>,
    accepted: &'a Accepted<'a>,
    meta: RequestMeta,
    /// The whole request body went up.
    request_done: bool,
    /// The client connection may stay open after the response (the whole request body
    /// went up: nothing of it is left to read).
    keep_alive: bool,
}

impl Response<'_> {
    /// Writes the response head (with the route's edits) and relays the body, compressed
    /// when the route's plan says so; pools the upstream connection when it is left clean.
    /// `fill`: a cache miss's, which stores the response (or answers instead of it).
    async fn respond(
        &self,
        conn: &mut ClientConn,
        mut stream: UpstreamStream,
        up_buf: &mut Buffer,
        resp: &mut ResponseHead,
        fill: Option<Box<Fill>>,
    ) -> Result<bool, Failure> {
        if resp.status == 101 {
            // Boxed: a tunnel's state is not every response's.
            return Box::pin(self.upgrade(conn, stream, up_buf, resp)).await;
        }
        // A 304 refreshing the stale entry, or a 5xx it may answer for: the entry answers
        // (the try counts with the upstream's status, the request with the reply's).
        let fetched = Fetched::Http1(up_buf.filled(), resp);
        if let Some(reply) = fill.as_ref().and_then(|f| f.answer_instead(fetched, false)) {
            self.accepted
                .pool_after_answer(stream, resp, up_buf, self.request_done);
            let under = Under::of_target(&self.x.target);
            let answered = send_http1(conn, under, reply, self.meta, self.keep_alive, resp);
            return Box::pin(answered).await;
        }
        let (route, meta) = (self.x.target.route, self.meta);
        let mut edits = Edits::of(route, &conn.resp_lines, self.accepted.server, &conn.host);
        edits.cookie = self.accepted.set_cookie();
        edits.plan = plan_http1(route, up_buf.filled(), resp, meta.is_head, meta.accepted);
        let encoding = edits.plan.encoding;
        // A compressed body is re-framed as chunks: it needs the raw bytes, and its end
        // no longer depends on the upstream's close.
        let dechunk = resp.framing == BodyFraming::Chunked && (meta.http10 || encoding.is_some());
        let status_line = fill.as_ref().and_then(|f| f.status_line());
        let recorder = fill.and_then(|f| f.admit(fetched, dechunk));
        let close = !self.keep_alive
            || (encoding.is_none() && (dechunk || resp.framing == BodyFraming::UntilClose));
        let framing = ClientFraming {
            dechunk,
            close,
            http10: meta.http10,
        };
        conn.out.clear();
        write_from_http1(&mut conn.out, up_buf.filled(), resp, &edits, &framing);
        if let Some(line) = status_line {
            push_before_end(&mut conn.out, line);
        }
        let listed = trailer::connection_listed(up_buf.filled(), &resp.headers, resp.framing);
        up_buf.consume(resp.head_len);
        let body_with_head = match at_hand(encoding, resp, up_buf) {
            // The usual small response: a Content-Length body all at hand goes out with its
            // head in one write, as the relay would send it, without its rounds.
            Some(n) => {
                self.accepted.count(Ok(resp.status));
                let (whole, timeout) =
                    (&up_buf.filled()[..n], self.x.target.listener.client_timeout);
                let written =
                    body::write_parts(&mut conn.stream, [&conn.out, whole], timeout).await;
                written.map_err(|e| Failure::after_head(Peer::Client.error(e)))?;
                conn.sent += (conn.out.len() + n) as u64;
                if let Some(recorder) = recorder {
                    recorder.finish_with(&up_buf.filled()[..n]);
                }
                up_buf.consume(n);
                true
            }
            None => {
                let up = Http1Response {
                    stream: &mut stream,
                    buf: &mut *up_buf,
                    head: resp,
                };
                // Boxed: the usual small response went out with its head above.
                let relayed = self.relay_body(conn, up, &edits.plan, dechunk, listed, recorder);
                Box::pin(relayed).await?
            }
        };
        self.accepted
            .reuse(stream, resp, up_buf, self.request_done, body_with_head);
        Ok(!close)
    }

    /// Relays the body of `up` after the head in `conn.out` (compressed when `plan` says so;
    /// `dechunk`: a chunked body is decoded; `listed`: the head's `Connection` values that
    /// name fields, which leave the trailers), counting the try; a cache's `recorder`
    /// keeps a copy of what the upstream sent, stored once all of it was relayed. Returns whether all of it came with the
    /// head (uncompressed: the connection is idle from the head's arrival).
    async fn relay_body(
        &self,
        conn: &mut ClientConn,
        up: Http1Response<'_>,
        plan: &Plan,
        dechunk: bool,
        listed: Vec<u8>,
        mut recorder: Option<Box<Recorder>>,
    ) -> Result<bool, Failure> {
        let (listener, upstream, resp) = (self.x.target.listener, self.x.target.upstream, up.head);
        // An HTTP/1.1 client gets the trailer section re-written (`forward::trailer`); an
        // HTTP/1.0 one, whose body is de-chunked, none.
        let state = match self.meta.http10 {
            true => BodyState::new(resp.framing, dechunk, None),
            false => BodyState::new(resp.framing, dechunk, None).keeping_trailers(),
        };
        let timeout = upstream.response_timeout;
        let mut source = Http1Source::new(up.stream, up.buf, state, timeout, Peer::Upstream);
        source.listed = listed;
        // Refused before any byte of it went out (a bad chunk with the head, a compressor
        // that did not start): the client gets Weir's 502, the try counts as one.
        let length = resp.framing.length();
        let route = self.x.target.route;
        let ready = coding(route, plan, length).and_then(|c| Ok((c, source.prime()?)));
        self.accepted
            .count(ready.as_ref().map(|_| resp.status).map_err(|e| *e));
        let (mut coding, body_with_head) = ready?;
        let dropping = Edits::dropping(route, *plan);
        let dropped = |name: &[u8]| dropping.drops(name);
        let mut sink = Http1Sink {
            writer: &mut conn.stream,
            timeout: listener.client_timeout,
            sent: &mut conn.sent,
            head: &conn.out,
            chunked: plan.encoding.is_some(),
            trailers: Some(&dropped),
        };
        let mut recording = Recording {
            inner: &mut source,
            recorder: recorder.as_deref_mut(),
            stop_when_over: false,
        };
        let relayed = relay(&mut recording, &mut sink, coding.as_mut()).await;
        conn.current.exchange.compressed = coding.as_ref().map(|c| c.counts);
        relayed.map_err(|(Broke::Source(e) | Broke::Sink(e))| Failure::after_head(e))?;
        if let Some(recorder) = recorder {
            recorder.finish();
        }
        Ok(body_with_head && coding.is_none())
    }

    /// Whether the 101 may be tunnelled: only an upgrade the request offered and the route
    /// allows, once the whole request was sent. A 101 to a request that offered no upgrade
    /// is the server's error; the other refusals answer a request the client shaped (a
    /// body it declared and never sent, an offer the server read its own way), so they do
    /// not count against the server (`UpgradeNotMade`).
    fn may_switch(&self, up_buf: &Buffer, resp: &ResponseHead) -> Result<(), ProxyError> {
        if self.meta.upgrade.is_empty() {
            return Err(ProxyError::UpstreamMalformed(
                "101 without an upgrade request",
            ));
        }
        if !self.request_done {
            return Err(ProxyError::UpgradeNotMade(
                "101 before the end of the request body",
            ));
        }
        let allowed = &self.x.target.route.upgrades;
        if !switch_allowed(&resp.headers, up_buf.filled(), allowed, self.meta.upgrade) {
            // Tunnelling would let the client speak a protocol the route does not allow
            // (h2c: any request, past the routes) straight to the server.
            return Err(ProxyError::UpgradeNotMade("101 to a protocol not offered"));
        }
        Ok(())
    }

    async fn upgrade(
        &self,
        conn: &mut ClientConn,
        mut stream: UpstreamStream,
        up_buf: &mut Buffer,
        resp: &ResponseHead,
    ) -> Result<bool, Failure> {
        let switch = self.may_switch(up_buf, resp);
        self.accepted.count(switch.map(|()| 101));
        switch?;
        let listener = self.x.target.listener;
        let (edits, framing) = (Edits::default(), ClientFraming::default());
        conn.out.clear();
        write_from_http1(&mut conn.out, up_buf.filled(), resp, &edits, &framing);
        up_buf.consume(resp.head_len);
        let written = body::write_parts(&mut conn.stream, [&conn.out], listener.client_timeout);
        written
            .await
            .map_err(|e| Failure::after_head(Peer::Client.error(e)))?;
        let limits = tunnel::limits(listener);
        // A plain client socket is registered now (a tunnel waits anyway), so a failed
        // registration cannot drop it while the relay's probe borrows its descriptor (a
        // TLS client's socket was registered for its handshake).
        if conn.stream.tls().is_none() {
            if let Err(e) = conn.stream.registered() {
                return Err(Failure::after_head(ProxyError::client_io(e)));
            }
        }
        let sockets = [conn.stream.raw_fd(), stream.tcp().as_raw_fd()];
        let (client, early) = (&mut conn.stream, &mut conn.buf);
        let end = tunnel::run(client, early, &mut stream, up_buf, limits, sockets);
        let end = end.await;
        crate::idle::count(self.x.worker, self.x.target.listener_slot, end);
        Ok(false)
    }
}
