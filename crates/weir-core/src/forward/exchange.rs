//! The exchange with one upstream server, in the order it happens on the wire.
//!
//! `forward` prepares the request once (`Forwarding`: what every attempt shares); each try
//! on a server is an `Attempt` (send the request, read the final response head); the
//! accepted attempt becomes an `Exchange`, which relays the response.

use std::future::Future;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use weir_config::{Encoding, Listener, Route, Upstream, UpstreamServer};

use super::body::{self, pump, BodyState, PumpError};
use super::request_head::{write_request_head, ClientFacts, RequestEdits};
use super::response_head::{write_response_head, ClientFraming};
use super::{tunnel, Failure, Reached};
use crate::buffer::Buffer;
use crate::client::ClientConn;
use crate::codec::http1::{parse_response, BodyFraming, RequestHead, ResponseHead};
// Upstream TLS: connections are `UpstreamStream`s (plain or TLS), made by
// `connect_server` and pooled under a key that includes the upstream's TLS client.
use crate::connector::{connect_server, PoolKey, TlsUpstream, UpstreamStream};
use crate::error::ProxyError;
use crate::filters::compression::{self, Plan};
use crate::filters::headers::{push_rules, Vars};
use crate::filters::location::ReverseMap;
use crate::filters::upgrade::{switch_allowed, Offered};
use crate::metrics::shard::ServerMetrics;
use crate::time::LazyTimer;
use crate::upstream::retry::{may_retry, replace_host, Outcome, Replay, Tried};
use crate::upstream::{Pick, RequestKey, UpstreamPlan};
use crate::worker::Worker;

/// What the exchange needs to remember about the request once its head is consumed.
#[derive(Clone, Copy)]
pub(crate) struct RequestMeta {
    pub is_head: bool,
    /// 1xx responses are not relayed (also set for an RFC 8441 tunnel, whose client
    /// waits for the 101 only).
    pub http10: bool,
    /// The upgrade protocols offered upstream (empty: not an upgrade).
    pub upgrade: Offered,
    pub idempotent: bool,
    /// The coding the route's `compression` negotiated with the client (`None`: identity,
    /// or no compression on the route).
    pub accepted: Option<Encoding>,
    /// 1xx heads read before the final one, at most (the listener's `max_informational`
    /// for HTTP/1.1 clients; for HTTP/2 clients the larger of it and
    /// `http2.max_informational`, their stream dropping those past its own bounds in
    /// `http2::interim`); one more fails the response.
    pub max_informational: u32,
}

/// Where the request goes and under which limits.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub listener: &'a Listener,
    /// The listener's metric slot.
    pub listener_slot: usize,
    pub route: &'a Route,
    pub upstream: &'a Upstream,
    /// The upstream's index in the config (the route may split over several).
    pub upstream_index: usize,
    /// The upstream's pool plan in the same snapshot.
    pub pool: &'a UpstreamPlan,
}

/// One request on its way upstream: what every attempt shares. The upstream request head
/// is in `conn.out`, followed in `conn.buf` by the `buffered` body bytes that came with it.
struct Forwarding<'a> {
    worker: &'a Worker,
    target: Target<'a>,
    key: RequestKey,
    meta: RequestMeta,
    buffered: usize,
    /// The client connection may stay open after the response.
    keep_alive: bool,
}

/// One attempt: the request sent to one server.
struct Attempt<'a> {
    fwd: &'a Forwarding<'a>,
    server: &'a UpstreamServer,
    metrics: Option<&'a ServerMetrics>,
    /// When the attempt started (the request's start for the first one: no clock read).
    started: std::time::Instant,
}

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
    if super::to_h2::translates(target.upstream) {
        return super::to_h2::forward(worker, target, conn, req, resp, keep_alive).await;
    }
    let (key, pick, upgrade) = pick_and_write_head(worker, target, conn, req)?;
    let http10 = req.minor_version == 0;
    let meta = RequestMeta {
        is_head: req.is_head,
        http10,
        upgrade,
        idempotent: req.idempotent,
        // HTTP/1.0 clients get identity: a compressed body has no length to announce,
        // and ending it by closing costs the connection.
        accepted: (target.route.filters.compression.as_ref())
            .filter(|_| !http10)
            .and_then(|c| compression::negotiate(c, conn.buf.filled(), &req.headers)),
        max_informational: target.listener.max_informational,
    };
    conn.host.clear();
    if let Some(host) = &req.host {
        conn.host
            .extend_from_slice(&conn.buf.filled()[host.clone()]);
    }
    conn.buf.consume(req.head_len);
    let mut body = BodyState::new(req.framing, false, target.listener.max_body_size);
    let (buffered, _) = body
        .take(conn.buf.filled_mut())
        .map_err(client_pump_error)?;
    let fwd = Forwarding {
        worker,
        target,
        key,
        meta,
        buffered,
        keep_alive,
    };
    let mut up_buf = worker.take_buffer();
    let result = fwd.exchange(pick, conn, body, &mut up_buf, resp).await;
    worker.give_buffer(up_buf);
    result
}

/// Picks the request's server (503 when there is none) and writes the upstream head for
/// it into `conn.out`; returns the hash key, the pick and the upgrades offered.
pub(super) fn pick_and_write_head(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
) -> Result<(RequestKey, Pick, Offered), ProxyError> {
    let buf = conn.buf.filled();
    let path = conn.path.get(req.path(buf));
    let key = RequestKey::new(&target.upstream.lb, buf, req, path, conn.client_text());
    let Some(pick) =
        (worker.upstreams).pick(target.upstream_index, target.pool, target.upstream, key)
    else {
        // Nothing was taken from the client yet: skipped like a request Weir answers
        // itself, the connection can go on if the body was all there.
        conn.request_read = conn.skip_body(req, target.listener).unwrap_or(false);
        return Err(ProxyError::NoServer);
    };
    let server = &target.upstream.servers[pick.server];
    conn.out.clear();
    let upgrade = write_head_with_policy(conn, req, &target, server);
    Ok((key, pick, upgrade))
}

/// Writes the upstream request head into `conn.out` with the route's header rules, and
/// renders its response-header lines into `conn.resp_lines` while the request is at hand.
fn write_head_with_policy(
    conn: &mut ClientConn,
    req: &RequestHead,
    target: &Target<'_>,
    server: &UpstreamServer,
) -> Offered {
    let (route, filters) = (target.route, &target.route.filters);
    let id_header = target.listener.policy.request_id.as_ref();
    let buf = conn.buf.filled();
    let no_rules = filters.request_headers.is_none() && filters.response_headers.is_none();
    let tls = conn.tls.as_deref();
    if id_header.is_none() && no_rules && conn.real_client.is_none() {
        let facts = ClientFacts {
            ip: &conn.ip,
            tls,
            edits: None,
        };
        return write_request_head(&mut conn.out, buf, req, &conn.path, route, server, facts);
    }
    let vars = Vars {
        scheme: if tls.is_some() { b"https" } else { b"http" },
        host: req.host.as_ref().map_or(&[][..], |r| &buf[r.clone()]),
        target: req.path(buf),
        // Field by field (not `client_text()`): `conn.out` is written below.
        client_ip: conn
            .real_client
            .as_ref()
            .map_or(&conn.ip, |(_, text)| text)
            .as_bytes(),
        request_id: conn.request_id.as_bytes(),
    };
    if let Some(rules) = &filters.response_headers {
        conn.resp_lines.clear();
        push_rules(&mut conn.resp_lines, rules, &vars);
    }
    let edits = RequestEdits {
        rules: filters.request_headers.as_ref(),
        request_id: id_header.map(|id| id.header.as_bytes()),
        real_client: conn.real_client.as_ref().map(|(_, text)| text),
        vars,
    };
    let facts = ClientFacts {
        ip: &conn.ip,
        tls,
        edits: Some(&edits),
    };
    write_request_head(&mut conn.out, buf, req, &conn.path, route, server, facts)
}

impl<'a> Forwarding<'a> {
    /// Sends the request to the picked server, retrying on other servers when the attempt
    /// fails in a way `upstream::retry` deems safe to retry, then relays the response.
    async fn exchange(
        &self,
        mut pick: Pick,
        conn: &mut ClientConn,
        mut body: BodyState,
        up_buf: &mut Buffer,
        resp: &mut ResponseHead,
    ) -> Result<bool, Failure> {
        let target = self.target;
        // The whole request is in the buffer (consumed only once a response is accepted),
        // so it can be replayed byte for byte.
        let whole = body.is_done();
        let mut tried = Tried::new(pick.server);
        // The first attempt starts with the request (no second clock read); retries read it.
        let mut started = conn.request_started;
        loop {
            let attempt = self.attempt(&pick, started);
            conn.upstream_pick = Some((target.upstream_index, pick.server));
            let sent = if whole {
                attempt
                    .send_buffered(conn, up_buf, resp)
                    .await
                    .map(|stream| (stream, true))
            } else {
                attempt.send_streaming(conn, &mut body, up_buf, resp).await
            };
            let elapsed = started.elapsed();
            let outcome = match &sent {
                Ok(_) => Outcome::Status(resp.status),
                Err(f) => Outcome::of_error(f.error),
            };
            // A response is counted once `respond` knows whether it is relayed (its status)
            // or refused before the client gets any of it (the error the client gets).
            if let Err(f) = &sent {
                attempt.count(&pick, Err(f.error), elapsed);
            }
            let replay = Replay {
                idempotent: self.meta.idempotent,
                buffered: whole,
                responded: sent.as_ref().is_err_and(|f| f.reached != Reached::Nothing),
            };
            if may_retry(&target.upstream.retry.on, outcome, replay) {
                if let Some(next) = self.next_attempt(&mut tried, conn, attempt.server) {
                    if sent.is_ok() {
                        attempt.count(&pick, Ok(resp.status), elapsed);
                    }
                    tracing::debug!(upstream = %target.upstream.name, server = %attempt.server.name, reason = outcome.reason(), "retrying on another server");
                    if let Some(m) = self.worker.metrics.upstream(target.pool.slot) {
                        m.retries.inc();
                    }
                    up_buf.clear();
                    drop(sent);
                    pick = next;
                    started = std::time::Instant::now();
                    continue;
                }
            }
            if whole {
                // Kept for replays until now. Consumed also when the exchange failed:
                // the request was read whole, the connection may go on after the answer.
                conn.buf.consume(self.buffered);
                conn.request_read = true;
            }
            let (stream, request_done) = sent?;
            conn.upstream_time = Some(elapsed);
            let exchange = Exchange {
                worker: self.worker,
                target,
                server: attempt.server,
                metrics: attempt.metrics,
                pick: &pick,
                elapsed,
                meta: self.meta,
                request_done,
                keep_alive: self.keep_alive,
                head_at: started + elapsed,
                set_cookie: target
                    .pool
                    .set_cookie(pick.server)
                    .filter(|_| pick.set_cookie),
            };
            // `pick` lives until the response is relayed: the request counts as in flight.
            return exchange.respond(conn, stream, up_buf, resp).await;
        }
    }

    /// An attempt on `pick`'s server, started at `started`.
    fn attempt(&self, pick: &Pick, started: std::time::Instant) -> Attempt<'_> {
        let pool = self.target.pool;
        Attempt {
            fwd: self,
            server: &self.target.upstream.servers[pick.server],
            metrics: self
                .worker
                .metrics
                .server(pool.slot, pool.server_slots[pick.server]),
            started,
        }
    }

    /// The next server to try after `failed`, with the request head's `Host` updated when
    /// it names the server.
    fn next_attempt(
        &self,
        tried: &mut Tried,
        conn: &mut ClientConn,
        failed: &UpstreamServer,
    ) -> Option<Pick> {
        let (target, u) = (self.target, self.target.upstream);
        let next =
            self.worker
                .upstreams
                .retry(target.upstream_index, target.pool, u, self.key, tried)?;
        let host_is_server = host_names_server(target.route, conn.host.is_empty());
        let new_name = u.servers[next.server].name.as_bytes();
        if host_is_server && !replace_host(&mut conn.out, failed.name.as_bytes(), new_name) {
            return None;
        }
        tried.push(next.server);
        Some(next)
    }
}

/// Whether the upstream request's `Host` is the server's name (so a retry on another
/// server must change it): not when the client's host is preserved, nor when a
/// `request_headers` rule sets it.
pub(crate) fn host_names_server(route: &Route, client_host_empty: bool) -> bool {
    let rule_host = (route.filters.request_headers.as_ref()).is_some_and(|r| r.sets_host);
    (!route.preserve_host || client_host_empty) && !rule_host
}

impl Attempt<'_> {
    /// The request is complete in the buffer: send it, and replay it once on a fresh
    /// connection if a pooled one proves dead before any response byte (idempotent only).
    async fn send_buffered(
        &self,
        conn: &mut ClientConn,
        up_buf: &mut Buffer,
        resp: &mut ResponseHead,
    ) -> Result<UpstreamStream, Failure> {
        let (upstream, meta) = (self.fwd.target.upstream, self.fwd.meta);
        let mut fresh = false;
        loop {
            let (mut stream, reused) = self.obtain(fresh).await?;
            let sent = body::write_all(
                &mut stream,
                &conn.out,
                &conn.buf.filled()[..self.fwd.buffered],
                upstream.response_timeout,
            )
            .await;
            let outcome = match sent {
                Ok(()) => {
                    // response_timeout counts from the end of the request. On a pooled
                    // connection the send completes at once, so that is when the attempt
                    // started (no clock read); after a connect (a new server, or a replay
                    // on a fresh connection) it is now.
                    let sent_at = if reused {
                        self.started
                    } else {
                        std::time::Instant::now()
                    };
                    let timer = &mut conn.upstream_timer;
                    timer.set(Instant::from_std(sent_at) + upstream.response_timeout);
                    let client = &mut conn.stream;
                    let client_timeout = self.fwd.target.listener.client_timeout;
                    read_final_head(
                        &mut stream,
                        up_buf,
                        resp,
                        meta,
                        client,
                        client_timeout,
                        Some(timer),
                    )
                    .await
                }
                Err(e) => Err(HeadError {
                    error: upstream_write_error(e),
                    received: false,
                    interim_sent: false,
                }),
            };
            match outcome {
                // The caller consumes the buffered request once it accepts the response.
                Ok(()) => return Ok(stream),
                Err(e) if reused && meta.idempotent && e.retryable() => {
                    tracing::debug!(server = %self.server.addr, error = %e.error, "pooled connection was dead; retrying on a new one");
                    up_buf.clear();
                    fresh = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The body is still arriving: stream it while waiting for the response head (which
    /// may come early, or be a `100 Continue` the client waits for). Returns whether the
    /// whole request body was sent.
    async fn send_streaming(
        &self,
        conn: &mut ClientConn,
        body: &mut BodyState,
        up_buf: &mut Buffer,
        resp: &mut ResponseHead,
    ) -> Result<(UpstreamStream, bool), Failure> {
        let target = self.fwd.target;
        let (mut stream, _) = self.obtain(false).await?;
        let response_timeout = target.upstream.response_timeout;
        let buffered = self.fwd.buffered;
        body::write_all(
            &mut stream,
            &conn.out,
            &conn.buf.filled()[..buffered],
            response_timeout,
        )
        .await
        .map_err(|e| Failure::from(upstream_write_error(e)))?;
        conn.buf.consume(buffered);
        // The pump consumed the whole body from the client buffer (whether the exchange
        // then fails or not).
        let mut body_read = false;
        let upload_done = {
            let (mut ur, mut uw) = stream.split();
            // A streamed upload waits on the client and the upstream at once: register.
            let (mut cr, mut cw) = conn.stream.split().map_err(ProxyError::client_io)?;
            let mut uploaded = 0;
            let client_timeout = target.listener.client_timeout;
            let upload = async {
                let pumped = pump(
                    &mut cr,
                    &mut conn.buf,
                    (&mut uw, &mut uploaded),
                    body,
                    (client_timeout, response_timeout),
                );
                let pumped = pumped.await;
                body_read = pumped.is_ok();
                pumped
            };
            let meta = self.fwd.meta;
            let head = read_final_head(&mut ur, up_buf, resp, meta, &mut cw, client_timeout, None);
            upload_while_waiting(upload, head, response_timeout).await
        };
        conn.request_read = body_read;
        Ok((stream, upload_done?))
    }

    /// A connection to the server: a pooled idle one unless `fresh`, else a new one.
    /// Returns whether it was reused.
    async fn obtain(&self, fresh: bool) -> Result<(UpstreamStream, bool), ProxyError> {
        let (worker, upstream) = (self.fwd.worker, self.fwd.target.upstream);
        let tls = self.fwd.target.pool.tls.as_deref();
        obtain(
            worker,
            (self.server, tls),
            upstream,
            self.metrics,
            self.started,
            fresh,
        )
        .await
    }

    /// Records the attempt's outcome: the status the server answered, or the error.
    fn count(&self, pick: &Pick, result: Result<u16, ProxyError>, elapsed: Duration) {
        count(self.fwd.target, self.metrics, pick, result, elapsed);
    }
}

/// Records an attempt's outcome: for the server's passive health and load balancing
/// (`pick`), and in the server's metrics.
fn count(
    target: Target<'_>,
    metrics: Option<&ServerMetrics>,
    pick: &Pick,
    result: Result<u16, ProxyError>,
    elapsed: Duration,
) -> Outcome {
    let outcome = match result {
        Ok(status) => Outcome::Status(status),
        Err(error) => Outcome::of_error(error),
    };
    pick.record(target.pool, target.upstream, outcome, elapsed);
    count_attempt(metrics, result, elapsed);
    if outcome == Outcome::ConnectError {
        if let Some(m) = metrics {
            m.connect_errors.inc();
        }
    }
    outcome
}

/// `count` for an attempt as a sender sees it: `sent` with the head in `resp`, or the
/// failure (HTTP/2 streams count here; HTTP/1 ones through `Exchange::count`).
pub(crate) fn record_attempt(
    target: Target<'_>,
    pick: &Pick,
    metrics: Option<&ServerMetrics>,
    sent: &Result<impl Sized, Failure>,
    resp: &ResponseHead,
    elapsed: Duration,
) -> Outcome {
    let result = match sent {
        Ok(_) => Ok(resp.status),
        Err(f) => Err(f.error),
    };
    count(target, metrics, pick, result, elapsed)
}

/// Runs a request body's `upload` and the wait for the response `head` together (the
/// response may come early, or be a `100 Continue` the client waits for). Returns whether
/// the whole body went up. `response_timeout` counts from the end of the upload, however
/// long the body takes to arrive (nginx's proxy_read_timeout does the same); while it
/// uploads, a stalled upstream is caught by the upload's write timeout.
pub(crate) async fn upload_while_waiting(
    upload: impl Future<Output = Result<(), PumpError>>,
    head: impl Future<Output = Result<(), HeadError>>,
    response_timeout: Duration,
) -> Result<bool, Failure> {
    let head_timer = tokio::time::sleep(Duration::MAX);
    tokio::pin!(upload, head, head_timer);
    let mut uploading = true;
    let mut upload_done = false;
    loop {
        tokio::select! {
            r = &mut upload, if uploading => {
                uploading = false;
                head_timer.as_mut().reset(Instant::now() + response_timeout);
                match r {
                    Ok(()) => upload_done = true,
                    // The upstream stopped reading; its response (if any) says why.
                    Err(PumpError::Write(_) | PumpError::WriteTimeout) => {}
                    Err(e) => return Err(Failure::from(client_pump_error(e))),
                }
            }
            h = &mut head => return h.map(|()| upload_done).map_err(Failure::from),
            () = &mut head_timer, if !uploading => return Err(Failure::from(ProxyError::UpstreamTimeout)),
        }
    }
}

/// A connection to `server`: a pooled idle one (checked against `now`) unless `fresh`,
/// else a new one. Returns whether it was reused.
pub(crate) async fn obtain(
    worker: &Worker,
    (server, tls): (&UpstreamServer, Option<&TlsUpstream>),
    upstream: &Upstream,
    metrics: Option<&ServerMetrics>,
    now: std::time::Instant,
    fresh: bool,
) -> Result<(UpstreamStream, bool), ProxyError> {
    if !fresh {
        let (reused, idle) =
            worker
                .pool
                .borrow_mut()
                .take(PoolKey::new(server, tls), upstream.idle_timeout, now);
        if let Some(m) = metrics {
            m.pool_idle.set(idle as u64);
        }
        if let Some(stream) = reused {
            return Ok((stream, true));
        }
    }
    let started = std::time::Instant::now();
    let stream = connect_server(upstream, server, tls).await?;
    if let Some(m) = metrics {
        m.connect.observe(started.elapsed());
    }
    Ok((stream, false))
}

/// Counts one attempt on a server: by the status it answered, or the one Weir answers for
/// it when it failed (502, 504). Attempts the client broke off are not the server's doing.
fn count_attempt(
    metrics: Option<&ServerMetrics>,
    result: Result<u16, ProxyError>,
    elapsed: Duration,
) {
    let Some(m) = metrics else { return };
    let status = match result {
        Ok(status) => {
            m.response.observe(elapsed);
            status
        }
        Err(error) => match error.status() {
            Some(status) => status,
            None => return,
        },
    };
    m.request(status).inc();
}

pub(crate) struct HeadError {
    pub error: ProxyError,
    /// Some response byte arrived: the upstream processed the request.
    pub received: bool,
    /// A 1xx was relayed: the client has response bytes.
    pub interim_sent: bool,
}

impl From<HeadError> for Failure {
    fn from(e: HeadError) -> Failure {
        let reached = if e.interim_sent {
            Reached::Interim
        } else {
            Reached::Nothing
        };
        Failure {
            error: e.error,
            reached,
        }
    }
}

impl HeadError {
    pub(crate) fn retryable(&self) -> bool {
        !self.received
            && matches!(
                self.error,
                ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_)
            )
    }
}

/// An upstream sent more 1xx heads than the listener's `max_informational`.
pub(crate) const TOO_MANY_INFORMATIONAL: ProxyError =
    ProxyError::UpstreamMalformed("too many informational responses");

/// Where the 1xx heads read before the final one go: an HTTP/1.1 client's socket (any
/// writer: the head's bytes as they came), or an HTTP/2 client's stream (`http2::interim`).
pub(crate) trait Interim {
    /// Relays the 1xx head `resp`, whose bytes are `head`, within `timeout`. Returns
    /// whether the client got it (an HTTP/2 stream may skip one); `Err`: the client is gone.
    fn relay(
        &mut self,
        head: &[u8],
        resp: &ResponseHead,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<bool, ()>>;
}

impl<W: AsyncWrite + Unpin> Interim for W {
    async fn relay(
        &mut self,
        head: &[u8],
        _: &ResponseHead,
        timeout: Duration,
    ) -> Result<bool, ()> {
        body::write_all(self, head, &[], timeout)
            .await
            .map(|()| true)
            .map_err(|_| ())
    }
}

/// Reads until a final (non-1xx) response head is parsed into `resp`, relaying 1xx heads
/// to `client` (not to HTTP/1.0 clients: `meta.http10`); a 1xx past
/// `meta.max_informational` fails the response (502). The whole head must arrive by the
/// deadline set on `timer` (when there is one; the streaming path times the wait itself,
/// from the end of the upload).
pub(crate) async fn read_final_head<R, W>(
    up: &mut R,
    up_buf: &mut Buffer,
    resp: &mut ResponseHead,
    meta: RequestMeta,
    client: &mut W,
    client_timeout: Duration,
    mut timer: Option<&mut LazyTimer>,
) -> Result<(), HeadError>
where
    R: AsyncRead + Unpin,
    W: Interim,
{
    let mut received = !up_buf.is_empty();
    let mut interim_sent = false;
    let mut informational = 0u32;
    let fail = |error, received, interim_sent| HeadError {
        error,
        received,
        interim_sent,
    };
    loop {
        // Nothing read yet (the usual case right after sending): nothing to parse.
        let complete = !up_buf.is_empty()
            && parse_response(
                up_buf.filled(),
                crate::worker::UPSTREAM_BUFFER,
                meta.is_head,
                resp,
            )
            .map_err(|e| fail(e, true, interim_sent))?;
        if !complete {
            let read = up_buf.read_from(up);
            let read = match timer.as_deref_mut() {
                Some(timer) => timer.within(read).await,
                None => Some(read.await),
            };
            match read {
                None => return Err(fail(ProxyError::UpstreamTimeout, received, interim_sent)),
                Some(Err(e)) => {
                    return Err(fail(ProxyError::upstream_io(e), received, interim_sent))
                }
                Some(Ok(0)) => {
                    return Err(fail(ProxyError::UpstreamClosed, received, interim_sent))
                }
                Some(Ok(_)) => received = true,
            }
            continue;
        }
        if !resp.is_interim() {
            return Ok(());
        }
        // An upstream sending 1xx in a loop would keep the client waiting (and reading)
        // until the response timeout; the heads the client already has commit no status.
        informational = informational.saturating_add(1);
        if informational > meta.max_informational {
            return Err(fail(TOO_MANY_INFORMATIONAL, true, interim_sent));
        }
        if !meta.http10 {
            let head = &up_buf.filled()[..resp.head_len];
            let relayed = client.relay(head, resp, client_timeout).await;
            // Err: the HTTP/1.1 client may have part of the head (so, `interim_sent`).
            interim_sent |= relayed.map_err(|_| fail(ProxyError::ClientClosed, true, true))?;
        }
        up_buf.consume(resp.head_len);
    }
}

/// The response half of an exchange.
struct Exchange<'a> {
    worker: &'a Worker,
    target: Target<'a>,
    server: &'a UpstreamServer,
    metrics: Option<&'a ServerMetrics>,
    /// The accepted attempt, counted by `respond` (see `Exchange::count`).
    pick: &'a Pick,
    elapsed: Duration,
    meta: RequestMeta,
    request_done: bool,
    keep_alive: bool,
    /// When the response head arrived (the pool's idle clock starts then when the whole
    /// body came with the head).
    head_at: std::time::Instant,
    /// A `Set-Cookie` line to add (sticky sessions).
    set_cookie: Option<&'a [u8]>,
}

impl Exchange<'_> {
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
            self.target
                .route
                .filters
                .response_headers
                .as_ref()
                .map(|rules| (rules, &conn.resp_lines[..])),
        );
        if let Some(line) = self.set_cookie {
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
        let client_timeout = self.target.listener.client_timeout;
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
        let upstream_timeout = self.target.upstream.response_timeout;
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
            let max_idle = self.target.upstream.max_idle;
            let idle_from = if body_was_buffered {
                self.head_at
            } else {
                std::time::Instant::now()
            };
            let key = PoolKey::new(self.server, self.target.pool.tls.as_deref());
            let idle = self
                .worker
                .pool
                .borrow_mut()
                .put(key, stream, max_idle, idle_from);
            if let Some(m) = self.metrics {
                m.pool_idle.set(idle as u64);
            }
        }
    }

    /// What the route's compression does to `resp` (nothing without `compression`).
    fn plan(&self, buf: &[u8], resp: &ResponseHead) -> Plan {
        let Some(cfg) = &self.target.route.filters.compression else {
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
                rules: self.target.route.filters.response_headers.as_ref(),
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
            self.target.upstream.response_timeout,
            self.target.listener.client_timeout,
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
        let status = result.as_ref().map(|(s, _)| *s).map_err(|e| *e);
        count(self.target, self.metrics, self.pick, status, self.elapsed);
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
        let allowed = &self.target.route.upgrades;
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
        let route = self.target.route;
        route.reverse_rewrite.then(|| ReverseMap {
            upstream_authority: self.server.name.as_bytes(),
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
            self.target.listener.client_timeout,
        )
        .await
        .map_err(|e| Failure::after_head(client_write_error(e)))?;
        let limits = tunnel::limits(self.target.listener);
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
        crate::idle::count(self.worker, self.target.listener_slot, end);
        Ok(false)
    }
}

pub(crate) fn upstream_write_error(e: PumpError) -> ProxyError {
    match e {
        PumpError::WriteTimeout => ProxyError::UpstreamTimeout,
        PumpError::Write(kind) => ProxyError::upstream_io(kind.into()),
        _ => ProxyError::UpstreamClosed,
    }
}

/// Errors while moving the request body, seen from the client side.
pub(crate) fn client_pump_error(e: PumpError) -> ProxyError {
    match e {
        PumpError::ReadTimeout => ProxyError::ClientTimeout,
        PumpError::Framing(reason) => ProxyError::BadRequest(reason),
        PumpError::TooLarge => ProxyError::BodyTooLarge,
        PumpError::Read(kind) => ProxyError::ClientIo(kind),
        PumpError::Truncated => ProxyError::ClientClosed,
        PumpError::Write(_) | PumpError::WriteTimeout => ProxyError::UpstreamClosed,
    }
}

/// Errors while moving the response body.
pub(crate) fn upstream_pump_error(e: PumpError) -> ProxyError {
    match e {
        PumpError::ReadTimeout => ProxyError::UpstreamTimeout,
        PumpError::Framing(reason) => ProxyError::UpstreamMalformed(reason),
        PumpError::Read(kind) => ProxyError::UpstreamIo(kind),
        PumpError::Truncated => ProxyError::UpstreamClosed,
        PumpError::TooLarge => ProxyError::UpstreamMalformed("body too large"),
        PumpError::Write(_) | PumpError::WriteTimeout => client_write_error(e),
    }
}

/// Errors while writing the response to the client.
pub(crate) fn client_write_error(e: PumpError) -> ProxyError {
    match e {
        PumpError::WriteTimeout => ProxyError::ClientTimeout,
        _ => ProxyError::ClientClosed,
    }
}
