//! An HTTP/1.x client's request to an HTTP/1.1 upstream, in the order it happens on the
//! wire.
//!
//! `forward` prepares the request once (the body already buffered, the coding the client
//! accepts, the client's `Host` for the response's locations); the driver
//! (`forward::driver`) sends it through [`Http1Sender`] (over `forward::h1`: the head and
//! the whole body in one write, or the body streamed while the response head is awaited);
//! the accepted try becomes a [`Response`], which relays the response.

use std::mem::take;
use std::os::fd::AsRawFd;

use weir_config::Encoding;

use super::body::{self, pump, BodyState};
use super::driver::{drive, Accepted, Attempt, Exchange, Miss, Sender, Tries};
use super::h1::{
    client_pump_error, client_write_error, reuse, send_streaming, send_whole, upstream_pump_error,
    Http1Interim, Reading, RequestMeta,
};
use super::request_head::{render_response_rules, write_upstream_head};
use super::response_head::{write_response_head, ClientFraming};
use super::{carrier, tunnel, Carrier, Failure, Target};
use crate::buffer::Buffer;
use crate::client::ClientConn;
use crate::codec::http1::{BodyFraming, RequestHead, ResponseHead};
use crate::connector::{UpstreamStream, WriteHalf};
use crate::error::ProxyError;
use crate::filters::compression::{self, Plan};
use crate::filters::location::ReverseMap;
use crate::filters::upgrade::switch_allowed;
use crate::metrics::shard::Protocol;
use crate::upstream::RequestKey;
use crate::worker::Worker;

/// Forwards the request whose head is at the start of `conn.buf`. `keep_alive`: the client
/// connection may stay open afterwards. Returns whether it does.
pub async fn forward(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
) -> Result<bool, Failure> {
    if carrier(Protocol::Http1, target.upstream) == Carrier::Http2 {
        return super::h2::forward_h2(worker, target, conn, req, resp, keep_alive).await;
    }
    let buf = conn.buf.filled();
    let path = conn.path.get(req.path(buf));
    let key = RequestKey::new(&target.upstream.lb, buf, req, path, conn.client_text());
    let http10 = req.minor_version == 0;
    let meta = RequestMeta {
        is_head: req.is_head,
        http10,
        upgrade: Default::default(),
        // HTTP/1.0 clients get identity: a compressed body has no length to announce,
        // and ending it by closing costs the connection.
        accepted: (target.route.filters.compression.as_ref())
            .filter(|_| !http10)
            .and_then(|c| compression::negotiate(c, buf, &req.headers)),
        max_informational: target.listener.max_informational,
    };
    conn.host.clear();
    if let Some(host) = &req.host {
        conn.host.extend_from_slice(&buf[host.clone()]);
    }
    let mut body = BodyState::new(req.framing, false, target.listener.max_body_size);
    let (buffered, _) = body
        .take(&mut conn.buf.filled_mut()[req.head_len..])
        .map_err(client_pump_error)?;
    let x = Exchange {
        worker,
        target,
        key,
        idempotent: req.idempotent,
    };
    let whole = body.is_done();
    let mut sender = Http1Sender {
        x: &x,
        conn,
        req,
        body,
        buffered,
        whole,
        consumed: false,
        body_read: false,
        up_buf: worker.take_buffer(),
        resp,
        meta,
    };
    let mut last_try = sender.conn.last_try;
    let started = sender.conn.request_started;
    let accepted = drive(&x, &mut sender, started, &mut last_try).await;
    let Http1Sender {
        conn,
        consumed,
        body_read,
        meta,
        resp,
        mut up_buf,
        ..
    } = sender;
    conn.last_try = last_try;
    // The request (the body too, when it was whole) is consumed once it is answered, or
    // failed: read whole, the connection may go on after Weir's answer.
    if !consumed {
        conn.buf
            .consume(req.head_len + if whole { buffered } else { 0 });
    }
    conn.request_read = whole || body_read;
    let result = match accepted {
        Ok(accepted) => {
            let ((stream, request_done), accepted) = accepted.take();
            let response = Response {
                x: &x,
                accepted: &accepted,
                meta,
                request_done,
                keep_alive,
            };
            response.respond(conn, stream, &mut up_buf, resp).await
        }
        Err(failure) => Err(failure),
    };
    worker.give_buffer(up_buf);
    result
}

/// Sends an HTTP/1.x client's request over HTTP/1.1 connections: the head written for
/// each try's server, and the body as it came.
struct Http1Sender<'x, 'c> {
    x: &'x Exchange<'x>,
    conn: &'c mut ClientConn,
    req: &'c RequestHead,
    body: BodyState,
    /// Body bytes after the head in the buffer (framing included).
    buffered: usize,
    /// The whole body is in the buffer (kept until a response is accepted).
    whole: bool,
    /// The head and the buffered body were consumed (a streamed upload began).
    consumed: bool,
    /// A streamed upload took the whole body from the client.
    body_read: bool,
    up_buf: Buffer,
    resp: &'c mut ResponseHead,
    meta: RequestMeta,
}

impl Sender for Http1Sender<'_, '_> {
    /// The connection, and whether the whole request body went up.
    type Sent = (UpstreamStream, bool);

    async fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> Result<(UpstreamStream, bool), Miss> {
        let (x, req) = (self.x, self.req);
        let conn = &mut *self.conn;
        let (mut out, mut lines) = (take(&mut conn.out), take(&mut conn.resp_lines));
        out.clear();
        let request = conn.request(req);
        self.meta.upgrade =
            write_upstream_head(&mut out, &request, &conn.path, &x.target, a.server);
        render_response_rules(&mut lines, &request, x.target.route);
        (conn.out, conn.resp_lines) = (out, lines);
        let listener = x.target.listener;
        let mut rd = Reading {
            up_buf: &mut self.up_buf,
            resp: self.resp,
            timer: &mut conn.upstream_timer,
            meta: self.meta,
            client_timeout: listener.client_timeout,
        };
        let sent = if self.whole {
            let body = &conn.buf.filled()[req.head_len..][..self.buffered];
            let mut interim = Http1Interim {
                writer: &mut conn.stream,
                timeout: listener.client_timeout,
            };
            let stream = send_whole(x, a, &conn.out, body, &mut rd, &mut interim).await?;
            (stream, true)
        } else {
            // A streamed upload waits on the client and the upstream at once: register.
            let (mut cr, mut cw) = conn.stream.split().map_err(ProxyError::client_io)?;
            let (head, buf, state) = (&conn.out, &mut conn.buf, &mut self.body);
            let (consumed, skip) = (&mut self.consumed, req.head_len + self.buffered);
            let body_read = &mut self.body_read;
            let timeouts = (listener.client_timeout, x.target.upstream.response_timeout);
            let upload = async |uw: &mut WriteHalf<'_>| {
                let first = &buf.filled()[req.head_len..skip];
                body::write_all(uw, head, first, timeouts.1).await?;
                buf.consume(skip);
                *consumed = true;
                let mut uploaded = 0;
                let pumped = pump(&mut cr, buf, (uw, &mut uploaded), state, timeouts).await;
                *body_read = pumped.is_ok();
                pumped
            };
            let mut interim = Http1Interim {
                writer: &mut cw,
                timeout: listener.client_timeout,
            };
            send_streaming(x, a, &mut rd, &mut interim, upload).await?
        };
        match tries.relays(self.resp.status, self.whole, false) {
            true => Ok(sent),
            false => Err(Miss::retried(self.resp.status)),
        }
    }

    fn replayable(&self) -> bool {
        self.whole
    }

    fn responded(&self) -> bool {
        false
    }
}

/// The response half of an exchange: the accepted try's response relayed to the client.
struct Response<'a> {
    x: &'a Exchange<'a>,
    accepted: &'a Accepted<'a, ()>,
    meta: RequestMeta,
    /// The whole request body went up.
    request_done: bool,
    keep_alive: bool,
}

impl Response<'_> {
    async fn respond(
        &self,
        conn: &mut ClientConn,
        mut stream: UpstreamStream,
        up_buf: &mut Buffer,
        resp: &ResponseHead,
    ) -> Result<bool, Failure> {
        if resp.status == 101 {
            return self.upgrade(conn, stream, up_buf, resp).await;
        }
        let coding = self.plan(up_buf.filled(), resp);
        let encoding = coding.encoding;
        // A compressed body is re-framed as chunks: it needs the raw bytes, and its end
        // no longer depends on the upstream's close.
        let dechunk =
            resp.framing == BodyFraming::Chunked && (self.meta.http10 || encoding.is_some());
        let close = !self.keep_alive
            || !self.request_done
            || (dechunk && encoding.is_none())
            || (resp.framing == BodyFraming::UntilClose && encoding.is_none());
        let framing = ClientFraming {
            dechunk,
            close,
            http10: self.meta.http10,
            coding,
        };
        conn.out.clear();
        let reverse = self.reverse_map(&conn.host);
        write_response_head(
            &mut conn.out,
            up_buf.filled(),
            resp,
            reverse.as_ref(),
            &framing,
            self.x
                .target
                .route
                .filters
                .response_headers
                .as_ref()
                .map(|rules| (rules, &conn.resp_lines[..])),
        );
        if let Some(line) = self.accepted.set_cookie() {
            // Before the head's final empty line.
            let at = conn.out.len() - 2;
            conn.out.splice(at..at, line.iter().copied());
        }
        if let Some(encoding) = encoding {
            self.relay_encoded(conn, &mut stream, up_buf, resp, (encoding, dechunk))
                .await?;
            self.reuse(stream, up_buf, resp, false);
            return Ok(!close);
        }
        up_buf.consume(resp.head_len);
        let mut state = BodyState::new(resp.framing, dechunk, None);
        let taken = state.take(up_buf.filled_mut()).map_err(upstream_pump_error);
        let (forward, consumed) = self.count(taken.map(|t| (resp.status, t)))?;
        let client_timeout = self.x.target.listener.client_timeout;
        body::write_all(
            &mut conn.stream,
            &conn.out,
            &up_buf.filled()[..forward],
            client_timeout,
        )
        .await
        .map_err(|e| Failure::after_head(client_write_error(e)))?;
        conn.sent += (conn.out.len() + forward) as u64;
        up_buf.consume(consumed);
        // The whole body came with the head (the usual small response): the connection is
        // idle from the head's arrival. Otherwise it is idle from the end of the pump.
        let body_was_buffered = state.is_done();
        let upstream_timeout = self.x.target.upstream.response_timeout;
        pump(
            &mut stream,
            up_buf,
            (&mut conn.stream, &mut conn.sent),
            &mut state,
            (upstream_timeout, client_timeout),
        )
        .await
        .map_err(|e| Failure::after_head(upstream_pump_error(e)))?;
        self.reuse(stream, up_buf, resp, body_was_buffered);
        Ok(!close)
    }

    /// Pools the upstream connection when the exchange left it clean. `body_was_buffered`:
    /// the whole body came with the head, so the connection is idle from the head's arrival.
    fn reuse(
        &self,
        stream: UpstreamStream,
        up_buf: &Buffer,
        resp: &ResponseHead,
        body_was_buffered: bool,
    ) {
        if resp.keeps_alive() && self.request_done && up_buf.is_empty() {
            let idle_from = if body_was_buffered {
                self.accepted.head_at
            } else {
                std::time::Instant::now()
            };
            let accepted = self.accepted;
            reuse(self.x, accepted.server, accepted.metrics, stream, idle_from);
        }
    }

    /// What the route's compression does to `resp` (nothing without `compression`).
    fn plan(&self, buf: &[u8], resp: &ResponseHead) -> Plan {
        let Some(cfg) = &self.x.target.route.filters.compression else {
            return Plan::default();
        };
        compression::plan(
            cfg,
            &compression::Response {
                status: resp.status,
                buf,
                headers: &resp.headers,
                framing: resp.framing,
                is_head: self.meta.is_head,
                accepted: self.meta.accepted,
                rules: self.x.target.route.filters.response_headers.as_ref(),
            },
        )
    }

    /// Relays the body compressed with `encoding`, as chunks, the head (in `conn.out`)
    /// going out with the first one; counts the bytes in `conn.compressed`.
    async fn relay_encoded(
        &self,
        conn: &mut ClientConn,
        stream: &mut UpstreamStream,
        up_buf: &mut Buffer,
        resp: &ResponseHead,
        (encoding, dechunk): (Encoding, bool),
    ) -> Result<(), Failure> {
        let levels = self
            .x
            .target
            .route
            .filters
            .compression
            .as_ref()
            .map(|c| c.levels);
        let encoder =
            compression::Encoder::new(encoding, &levels.unwrap_or_default(), resp.framing.length());
        let encoder = encoder
            .map(|e| (resp.status, e))
            .map_err(|_| ProxyError::UpstreamMalformed("compressor failed"));
        let encoder = self.count(encoder)?;
        up_buf.consume(resp.head_len);
        let mut job = body::Compressing {
            encoder,
            state: BodyState::new(resp.framing, dechunk, None),
            bytes_in: 0,
            bytes_out: 0,
        };
        let timeouts = (
            self.x.target.upstream.response_timeout,
            self.x.target.listener.client_timeout,
        );
        let mut head = std::mem::take(&mut conn.out);
        let sent = body::pump_encoded(
            stream,
            up_buf,
            (&mut conn.stream, &mut conn.sent),
            (&mut job, &mut head),
            timeouts,
        )
        .await;
        conn.out = head;
        conn.compressed = Some(compression::Compressed {
            encoding,
            bytes_in: job.bytes_in,
            bytes_out: job.bytes_out,
        });
        sent.map_err(|e| Failure::after_head(upstream_pump_error(e)))
    }

    /// Counts the accepted attempt, once, as the client will see it: `Ok((status, t))` when
    /// the response is relayed, the error (the client's 502) when it is refused before any
    /// byte of it is sent. Gives back `t` or the failure.
    fn count<T>(&self, result: Result<(u16, T), ProxyError>) -> Result<T, Failure> {
        self.accepted
            .count(result.as_ref().map(|(s, _)| *s).map_err(|e| *e));
        result.map(|(_, t)| t).map_err(Failure::from)
    }

    /// Whether the 101 may be tunnelled: only an upgrade the request offered and the route
    /// allows.
    fn may_switch(&self, up_buf: &Buffer, resp: &ResponseHead) -> Result<(), ProxyError> {
        if self.meta.upgrade.is_empty() || !self.request_done {
            return Err(ProxyError::UpstreamMalformed(
                "101 without an upgrade request",
            ));
        }
        let allowed = &self.x.target.route.upgrades;
        if !switch_allowed(&resp.headers, up_buf.filled(), allowed, self.meta.upgrade) {
            // Tunnelling would let the client speak a protocol the route does not allow
            // (h2c: any request, past the routes) straight to the server.
            return Err(ProxyError::UpstreamMalformed(
                "101 to a protocol not offered",
            ));
        }
        Ok(())
    }

    fn reverse_map<'h>(&'h self, host: &'h [u8]) -> Option<ReverseMap<'h>> {
        let route = self.x.target.route;
        route.reverse_rewrite.then(|| ReverseMap {
            upstream_authority: self.accepted.server.name.as_bytes(),
            public_authority: (!host.is_empty()).then_some(host),
            upstream_prefix: route
                .rewrite_prefix
                .as_deref()
                .unwrap_or(&route.path_prefix),
            public_prefix: &route.path_prefix,
        })
    }

    async fn upgrade(
        &self,
        conn: &mut ClientConn,
        mut stream: UpstreamStream,
        up_buf: &mut Buffer,
        resp: &ResponseHead,
    ) -> Result<bool, Failure> {
        self.count(self.may_switch(up_buf, resp).map(|()| (101, ())))?;
        let framing = ClientFraming {
            dechunk: false,
            close: false,
            http10: false,
            coding: Plan::default(),
        };
        conn.out.clear();
        write_response_head(&mut conn.out, up_buf.filled(), resp, None, &framing, None);
        up_buf.consume(resp.head_len);
        body::write_all(
            &mut conn.stream,
            &conn.out,
            &[],
            self.x.target.listener.client_timeout,
        )
        .await
        .map_err(|e| Failure::after_head(client_write_error(e)))?;
        let limits = tunnel::limits(self.x.target.listener);
        // A plain client socket is registered now (a tunnel waits anyway), so a failed
        // registration cannot drop it while the relay's probe borrows its descriptor (a
        // TLS client's socket was registered for its handshake).
        if conn.stream.tls().is_none() {
            if let Err(e) = conn.stream.registered() {
                return Err(Failure::after_head(ProxyError::client_io(e)));
            }
        }
        let sockets = [conn.stream.raw_fd(), stream.tcp().as_raw_fd()];
        let bounds = (limits, sockets);
        let end = tunnel::run(&mut conn.stream, &mut conn.buf, &mut stream, up_buf, bounds);
        let end = end.await;
        crate::idle::count(self.x.worker, self.x.target.listener_slot, end);
        Ok(false)
    }
}
