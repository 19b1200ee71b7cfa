//! An HTTP/2 or HTTP/3 stream's exchange with an HTTP/1.1 upstream server.
//!
//! The tries are the driver's (`forward::driver`), over `forward::h1` (the head written for
//! each try's server, a pooled or new connection, the final head with 1xx relayed by
//! `interim`), as for HTTP/1.x clients. What differs is the body: request DATA is written
//! upstream and only then released to the client's window (flow control follows the
//! upstream's pace), and the response body goes out as DATA within the client's window.
//! A client reset during any wait drops the upstream connection: the server sees the
//! request cancelled, and a half-done exchange is never pooled.

use std::cell::Cell;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use tokio::io::AsyncWrite;
use weir_config::UpstreamServer;

use super::filling::mark;
use super::interim::{Bounds, ClientStream, Relayed};
use super::respond::{head_from_http1, ResponseStream, Sinking};
use super::scratch::ExchangeScratch;
use super::send::unless_reset;
use super::websocket::check_handshake_answer;
use crate::buffer::Buffer;
use crate::cache::Fetched;
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::connector::{UpstreamStream, WriteHalf};
use crate::error::ProxyError;
use crate::filters::compression;
use crate::filters::upgrade::Offered;
use crate::forward::body::BodyState;
use crate::forward::driver::{drive, Accepted, Attempt, Exchange, Miss, Sender, Tries};
use crate::forward::exchange::push_before_end;
use crate::forward::h1::{
    send_streaming, send_whole, Http1Response, Interim, Reading, RequestMeta,
};
use crate::forward::head::{coding, plan_http1, Edits};
use crate::forward::relay::{
    at_hand, relay, Broke, Dropped, H2Source, Http1Sink, Http1Source, Peer, Piece, Recording, Sink,
    Source,
};
use crate::forward::request_head::{render_response_rules, write_upstream_head, HeadNames};
use crate::forward::trailer;
use crate::forward::{Failure, Target};
use crate::request::{Request, Trace};
use crate::router::RoutedPath;
use crate::time::LazyTimer;
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
    /// A route cache's miss, while its exchange with the upstream may use it
    /// (`http2::filling`).
    pub fill: Cell<Option<Box<crate::cache::Fill>>>,
    /// Room for the route's `response_headers` lines, rendered for each response the
    /// HTTP/2 sender relays (nothing when the route has none): an HTTP/1.x client's
    /// connection lends its own (`ClientConn::resp_lines`), so that no request allocates.
    pub response_lines: Cell<Vec<u8>>,
}

impl StreamRequest<'_> {
    /// What every try of the request shares.
    pub(crate) fn exchange_of(&self) -> Exchange<'_> {
        let (r, u) = (&self.request, self.target.upstream);
        let path = self.path.get(r.req.path(r.buf));
        let client = r.origin.client_text();
        Exchange {
            worker: self.worker,
            target: self.target,
            key: RequestKey::new(&u.lb, r.buf, r.req, path, client),
            idempotent: r.req.idempotent,
            trace: r.trace,
        }
    }

    /// Appends the upstream HTTP/1.1 head for `server` (`forward::request_head`), with a
    /// cache miss's conditional lines.
    pub(crate) fn write_head(&self, out: &mut Vec<u8>, server: &UpstreamServer) -> Offered {
        let offered = write_upstream_head(out, &self.request, self.path, &self.target, server);
        self.with_fill(|fill| push_before_end(out, fill.conditional_lines()));
        offered
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
        let mut scratch = self.worker.h2_scratch.exchanges.take();
        let ExchangeScratch { out, resp, timer } = &mut scratch;
        let x = self.exchange_of();
        let body_in = Cell::new(0);
        let accepted = {
            let client = ClientStream::new(self, respond, body.is_some());
            let listener = self.target.listener;
            let mut body = body;
            let source = body.as_mut().map(|body| {
                let mut source =
                    H2Source::new(body, listener.client_timeout, Peer::Client, &body_in)
                        .paced(listener.min_body_rate.filter(|_| !trace.grpc));
                source.limit = listener.max_body_size;
                source
            });
            let mut sender = StreamSender {
                r: self,
                body: source,
                up_buf: &mut up_buf,
                out,
                resp: &mut *resp,
                timer,
                interim: &client,
                websocket_key: None,
            };
            // Pinned where it is built: the future holds every await of the upstream
            // exchange (large), and `unless_reset` would otherwise move it into its own
            // state once more (callgrind: about -0.4k instructions of `memcpy` per stream).
            let started = self.request.started;
            let driving = std::pin::pin!(drive(&x, &mut sender, started, &mut trace.last_try));
            unless_reset(|cx| client.poll_reset(cx), driving).await
        };
        trace.body_in = body_in.get();
        let result = match accepted {
            Ok(Ok(accepted)) => {
                self.respond_accepted(accepted, respond, &mut up_buf, resp, trace)
                    .await
            }
            Ok(Err(failure)) => Err(failure),
            Err(stop) => Err(stop.noted(trace).into()),
        };
        self.worker.h2_scratch.exchanges.give(scratch);
        self.worker.give_buffer(up_buf);
        result
    }

    /// Relays the accepted try's response (its head `resp`, parsed from `up_buf`) to the
    /// client's stream `respond` (HTTP/2 or HTTP/3), or a stored entry instead; pools the
    /// upstream connection when the exchange left it clean.
    pub(crate) async fn respond_accepted<R: ResponseStream>(
        &self,
        accepted: ((UpstreamStream, bool), Accepted<'_>),
        respond: &mut R,
        up_buf: &mut Buffer,
        resp: &ResponseHead,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let ((mut stream, request_done), accepted) = accepted;
        if let Some(reply) = self.answer_instead(Fetched::Http1(up_buf.filled(), resp), false) {
            accepted.pool_after_answer(stream, resp, up_buf, request_done);
            return Box::pin(self.reply_from_store(respond, reply, trace)).await;
        }
        let mut lines = Vec::new();
        let mut edits = self.edits(&mut lines, accepted.server);
        edits.cookie = accepted.set_cookie();
        let up = Http1Response {
            stream: &mut stream,
            buf: up_buf,
            head: resp,
        };
        let count = |result| accepted.count(result);
        let body_with_head = self.respond_http1(respond, up, edits, count, trace).await?;
        accepted.reuse(stream, resp, up_buf, request_done, body_with_head);
        Ok(())
    }

    /// The route's edits for a response from `server`, the `response_headers` lines
    /// rendered into `lines` (nothing without rules).
    #[inline]
    pub(crate) fn edits<'e>(
        &'e self,
        lines: &'e mut Vec<u8>,
        server: &'e UpstreamServer,
    ) -> Edits<'e> {
        let r = &self.request;
        render_response_rules(lines, r, self.path, self.target.route);
        let host = r.req.host.as_ref().map_or(&[][..], |h| &r.buf[h.clone()]);
        Edits::of(self.target.route, lines, server, host)
    }

    /// The coding the route's `compression` negotiated with the client (`None`: identity).
    pub(crate) fn accepted(&self) -> Option<weir_config::Encoding> {
        let cfg = self.target.route.filters.compression.as_ref()?;
        compression::negotiate(cfg, self.request.buf, &self.request.req.headers)
    }

    /// Sends an HTTP/1.1 upstream's response `up` to the client's stream: the head with
    /// `edits` (the compression plan made here), then the body, its trailers as a trailing
    /// HEADERS frame. The try is counted once with `count`: with its status, or with the
    /// error the client gets when the response is refused before any of it went out (a
    /// bad chunk with the head, a compressor that did not start). Returns whether the whole
    /// body came with the head.
    pub(super) async fn respond_http1<R: ResponseStream>(
        &self,
        respond: &mut R,
        up: Http1Response<'_>,
        mut edits: Edits<'_>,
        count: impl FnOnce(Result<u16, ProxyError>),
        trace: &mut Trace,
    ) -> Result<bool, Failure> {
        let (resp, route, listener) = (up.head, self.target.route, self.target.listener);
        // One copy of what arrived (the head, often the whole body too): the head's values
        // and the first DATA are slices of it, not an allocation each.
        let arrived = self.worker.h2_scratch.copy(up.buf.filled());
        let is_head = self.request.req.is_head;
        edits.plan = plan_http1(route, up.buf.filled(), resp, is_head, self.accepted());
        let mut head = head_from_http1(resp, &arrived, &edits, self.spare.take());
        let (cache_status, mut recorder) = self.admission(Fetched::Http1(up.buf.filled(), resp));
        mark(&mut head, cache_status);
        let listed = trailer::connection_listed(up.buf.filled(), &resp.headers, resp.framing);
        up.buf.consume(resp.head_len);
        // The usual small response: its body all at hand, nothing to frame or check.
        let at_hand = at_hand(edits.plan.encoding, resp, up.buf);
        // A chunked body's trailers go to the client as trailing HEADERS.
        let state = BodyState::new(resp.framing, true, None).keeping_trailers();
        let empty = self.request.req.is_head || state.is_done();
        let timeout = self.target.upstream.response_timeout;
        let mut source = Http1Source::new(up.stream, up.buf, state, timeout, Peer::Upstream);
        source.listed = listed;
        // A chunked body is decoded in place: its bytes differ from `arrived`.
        source.first =
            (resp.framing != BodyFraming::Chunked).then(|| arrived.slice(resp.head_len..));
        let length = resp.framing.length();
        let ready = coding(route, &edits.plan, length);
        let ready = ready.and_then(|c| Ok((c, empty || at_hand.is_some() || source.prime()?)));
        count(ready.as_ref().map(|_| resp.status).map_err(|e| *e));
        let (mut coding, body_with_head) = ready?;
        trace.status = resp.status;
        let grpc_status = trace.grpc_status_in(head.headers());
        let sink = Sinking {
            grpc_status,
            ..Sinking::of(&listener.http2, &edits, trace)
        };
        let at = resp.head_len;
        let whole = at_hand.map(|n| arrived.slice(at..at + n));
        if let (Some(recorder), Some(whole)) = (&mut recorder, whole.as_ref().filter(|_| !empty)) {
            recorder.record(whole);
        }
        let mut recording = Recording {
            inner: &mut source,
            recorder: recorder.as_deref_mut(),
            stop_when_over: false,
        };
        let body = (!empty).then_some(&mut recording);
        let relayed = respond
            .send_relayed(head, body, sink, coding.as_mut(), whole)
            .await;
        if !empty {
            trace.compressed = coding.as_ref().map(|c| c.counts);
        }
        relayed?;
        if let Some(n) = at_hand.filter(|_| !empty) {
            source.buf.consume(n);
        }
        if let Some(recorder) = recorder {
            recorder.finish();
        }
        Ok(body_with_head)
    }

    /// Sends the client a 100 when it sent `expect: 100-continue` with a request that has
    /// a `body`: the client may wait for it before sending DATA; Weir reads the body at
    /// once, so it answers itself (and relays no upstream 100 after it: `interim`).
    pub(super) fn continue_if_asked(&self, body: bool, respond: &mut SendResponse<Bytes>) {
        if self.request.req.expect_continue && body {
            let mut go_on = http::Response::new(());
            *go_on.status_mut() = http::StatusCode::CONTINUE;
            let _ = respond.send_informational(go_on);
        }
    }

    /// The bounds of this response's 1xx heads: the listener's `max_informational` heads
    /// of `max_header_list_size` in all, a 100 only if Weir sent none.
    pub(crate) fn interim_bounds(&self, body: bool) -> Bounds {
        let h2 = &self.target.listener.http2;
        Bounds {
            heads: h2.max_informational,
            bytes: h2.max_header_list_size,
            sent_continue: self.request.req.expect_continue && body,
        }
    }

    /// The most 1xx heads an upstream may send before its final head: the listener's
    /// `max_informational`, or `http2.max_informational` when that relays more (the stream
    /// drops those past it, `interim`). One more fails the response (502), so an upstream
    /// looping on 103 cannot hold the stream until `response_timeout`.
    pub(crate) fn informational_bound(&self) -> u32 {
        let listener = &self.target.listener;
        listener
            .max_informational
            .max(listener.http2.max_informational)
    }
}

/// Sends a stream's request over HTTP/1.1 connections, for HTTP/2 and HTTP/3 clients: the
/// head written for each try's server, the body (if any) streamed from the client's
/// stream (`body`: its DATA, [`H2Source`] or `http3::body::H3Source`, which count it and
/// hold it to `max_body_size`), 1xx heads relayed to `interim`. With a `websocket_key`,
/// the head is an RFC 8441 tunnel's Upgrade request (`http2::websocket`): it goes on a new
/// connection (which becomes the tunnel, never pooled again), its client waits for the
/// 101 only, and the answer must be a WebSocket server's.
pub(crate) struct StreamSender<'s, S, I> {
    pub r: &'s StreamRequest<'s>,
    pub body: Option<S>,
    pub up_buf: &'s mut Buffer,
    pub out: &'s mut Vec<u8>,
    pub resp: &'s mut ResponseHead,
    pub timer: &'s mut LazyTimer,
    pub interim: I,
    pub websocket_key: Option<&'s [u8]>,
}

impl<S: Source, I: Interim> Sender for StreamSender<'_, S, I> {
    /// The connection, and whether the whole request body went up (a WebSocket handshake
    /// has none: always `true`, unused).
    type Sent = (UpstreamStream, bool);

    async fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> Result<(UpstreamStream, bool), Miss> {
        let (r, x) = (self.r, tries.x);
        self.out.clear();
        let offered = r.write_head(self.out, a.server);
        let mut meta = RequestMeta {
            is_head: r.request.req.is_head,
            // 1xx heads go to the client's stream (`interim`).
            http10: false,
            upgrade: Offered::default(),
            accepted: None,
            max_informational: r.informational_bound(),
        };
        let mut a = *a;
        if self.websocket_key.is_some() {
            // A handshake never streams an upload: its tunnel carries the client's bytes.
            debug_assert!(self.body.is_none(), "a WebSocket handshake with a body");
            (meta.http10, meta.upgrade, a.fresh) = (true, offered, true);
        }
        let mut rd = Reading {
            up_buf: self.up_buf,
            resp: self.resp,
            timer: self.timer,
            meta,
        };
        let sent = match self.body.as_mut() {
            None => send_whole(x, &a, self.out, &[], &mut rd, &mut self.interim).await?,
            Some(body) => {
                let head = &*self.out;
                // Trailer fields go only in a chunked body (none with a content-length).
                let chunked = r.request.req.framing == BodyFraming::Chunked;
                let names = chunked.then(|| HeadNames::of(&r.target, r.request.trace.is_some()));
                let timeout = x.target.upstream.response_timeout;
                let upload =
                    async |uw: &mut WriteHalf<'_>| upload(body, uw, head, names, timeout).await;
                send_streaming(x, &a, &mut rd, &mut self.interim, upload).await?
            }
        };
        match self.websocket_key {
            Some(key) => check_handshake_answer(r, key, offered, self.resp, self.up_buf.filled())?,
            // No upgrade was offered: a final 101 is the server's error, and neither h2
            // nor h3 could send it.
            None if self.resp.status == 101 => {
                return Err(ProxyError::UpstreamMalformed("101 without an upgrade request").into())
            }
            None => {}
        }
        tries.relays(self.resp.status, self.replayable(), self.responded())?;
        Ok(sent)
    }

    fn replayable(&self) -> bool {
        self.body.is_none()
    }

    fn responded(&self) -> bool {
        self.r.relayed.any()
    }
}

/// Uploads a client stream's request body `source` to an HTTP/1.1 upstream's writer `up`
/// after `head`, each write within `timeout`; each piece is released to the client's
/// window once written (`forward::relay`). With `names` the body is chunk-framed and its
/// trailer fields the request head would carry go in its trailer section.
async fn upload<S: Source, W: AsyncWrite + Unpin>(
    source: &mut S,
    up: &mut W,
    head: &[u8],
    names: Option<HeadNames<'_>>,
    timeout: Duration,
) -> Result<(), Broke> {
    let mut written = 0;
    let dropped = names.map(|names| move |name: &[u8]| !names.forwards(name));
    let mut sink = Http1Sink {
        writer: up,
        timeout,
        sent: &mut written,
        head,
        chunked: names.is_some(),
        trailers: dropped.as_ref().map(|d| d as Dropped<'_>),
    };
    // The head goes at once, not with the first DATA.
    sink.data(Piece::Slice(&[]), false)
        .await
        .map_err(Broke::Sink)?;
    relay(source, &mut sink, None).await
}

#[cfg(test)]
mod tests {
    use super::super::test_io::{request_body, Holding};
    use crate::forward::relay::{H2Source, Peer};
    use crate::forward::request_head::HeadNames;
    use crate::request::Trace;
    use std::time::Duration;

    /// Uploads a request body of two DATA frames to a [`Holding`] writer; returns
    /// (held, sent) once the upload returned.
    async fn upload_to_holding(chunked: bool) -> (usize, usize) {
        let mut body = request_body(&[b"hello", b"world"], true).await;
        let mut up = Holding::default();
        let timeout = Duration::from_secs(10);
        let total = std::cell::Cell::new(0);
        let mut source = H2Source::new(&mut body, timeout, Peer::Client, &total);
        let names = HeadNames {
            forwarded: false,
            cert_header: None,
            request_id: None,
            rules: None,
            traced: false,
        };
        super::upload(&mut source, &mut up, &[], chunked.then_some(names), timeout)
            .await
            .expect("uploaded");
        assert_eq!(total.get(), 10);
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
