//! One h2 stream's exchange with an HTTP/2 upstream (`protocol = "h2"`, `"h2c"`, `"auto"`):
//! h2 end to end, trailers both ways, as gRPC needs.
//!
//! The upstream request says what the HTTP/1.1 head `forward::request_head` writes for any
//! request says (rewrites, forwarding headers, host), as HTTP/2 fields: request line to
//! pseudo-headers, `Host` to `:authority`, connection-specific fields dropped, `te:
//! trailers` kept when the client sent it. The first one is made from the client's own
//! request (`upstream_request`); one sent again after a refusal from that head
//! (`h1_head_to_h2`). Request DATA goes upstream within the upstream's window (the
//! first piece, up to `EAGER_FIRST_PIECE`, at once) and is released to the client's window
//! only once sent, so the client is paced by the upstream; the response streams back the
//! same way, then its trailers.
//! Upload and response run at once (bidirectional streaming).
//!
//! Connections come from the worker's `connector::h2` pool. A stream the server never
//! processed (a GOAWAY below it, REFUSED_STREAM, or a connection that stopped taking
//! streams) is sent again on another connection if none of the request body was consumed
//! yet; other failures before the response head are the caller's to answer (502/504, or
//! a gRPC status). `grpc-timeout` caps the response timeout.

use std::cell::Cell;
use std::future::poll_fn;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::Scheme;
use weir_config::{UpstreamProtocol, UpstreamServer};

use super::exchange::{cookie_value, StreamRequest, Trace};
use super::interim::{final_h2_head, NoFinalHead};
use super::send::{send_bytes, send_data, unless_reset, Stop};
use super::upstream_request::{upstream_request, Upstream};
use crate::codec::http1::ResponseHead;
use crate::connector::h2::{checkout, h2_error, never_processed, Checkout, Lease};
use crate::error::ProxyError;
use crate::forward::exchange::{record_attempt, TOO_MANY_INFORMATIONAL};
use crate::forward::{Failure, Reached};
use crate::time::with_timeout;
use crate::upstream::retry::{may_retry, Replay, Tried};

/// Most tries on new connections when streams are refused (GOAWAY) before one is taken.
const MAX_REFUSED: usize = 5;

/// What the h2 path needs from the client's fields, read before they are dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct H2Facts {
    /// The client sent `te: trailers`.
    pub te_trailers: bool,
    /// `content-type: application/grpc` (or `+proto`, `;...`): failures are answered with a
    /// gRPC status.
    pub grpc: bool,
    /// The client's `grpc-timeout`.
    pub grpc_timeout: Option<Duration>,
}

impl H2Facts {
    /// One pass over the request's few fields rather than three hashed lookups; the
    /// first value of a name counts, as `HeaderMap::get` gives it.
    pub fn of(headers: &HeaderMap) -> H2Facts {
        let (mut content_type, mut te, mut timeout) = (None, None, None);
        for (name, value) in headers {
            let slot = if name == http::header::CONTENT_TYPE {
                &mut content_type
            } else if name == http::header::TE {
                &mut te
            } else if name.as_str() == "grpc-timeout" {
                &mut timeout
            } else {
                continue;
            };
            slot.get_or_insert(value.as_bytes());
        }
        H2Facts {
            te_trailers: te == Some(&b"trailers"[..]),
            grpc: content_type.is_some_and(is_grpc_content_type),
            grpc_timeout: timeout.and_then(grpc_timeout),
        }
    }
}

/// Whether a `content-type` is gRPC's: `application/grpc`, alone or followed by `+` (a
/// message format such as `+proto`) or `;` (parameters), in any case. gRPC-Web
/// (`application/grpc-web*`) is not: its clients read trailers from the body and take
/// an HTTP status as it is.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Whether requests of HTTP/2 clients to this upstream go over HTTP/2.
pub fn speaks_h2(upstream: &weir_config::Upstream) -> bool {
    match upstream.protocol {
        UpstreamProtocol::Http1 => false,
        UpstreamProtocol::H2 | UpstreamProtocol::H2c => true,
        UpstreamProtocol::Auto => upstream.tls.is_some(),
    }
}

/// How one try on one server ended.
enum Try {
    /// `auto` and the server chose HTTP/1.1.
    Http1,
    /// Over, one way or the other; `consumed`: request body was taken from the client.
    Over(Result<(), Failure>, bool),
}

impl StreamRequest<'_> {
    /// Forwards the request to an HTTP/2 upstream and relays the response and trailers.
    /// On `Err` with `Reached::Nothing` nothing was sent: the caller answers.
    pub async fn forward_h2(
        &self,
        facts: &H2Facts,
        parts: Parts,
        mut body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        // The client's request, for the first request sent upstream.
        let mut client = Some(parts);
        let (worker, target) = (self.worker, self.target);
        let (u, pool) = (target.upstream, target.pool);
        let (key, mut pick) = self.first_pick()?;
        let mut tried = Tried::new(pick.server);
        loop {
            let server = &u.servers[pick.server];
            trace.upstream_pick = Some((target.upstream_index, pick.server));
            let started = Instant::now();
            trace.upstream_time = None;
            let cookie = pool
                .set_cookie(pick.server)
                .filter(|_| pick.set_cookie)
                .and_then(cookie_value);
            let sending = (&mut client, &mut body);
            let at = (server, started);
            let tried_server = self.try_server(facts, at, cookie, sending, respond, trace);
            let (result, consumed) = match tried_server.await {
                Try::Http1 => {
                    drop(pick);
                    return self.forward(body, respond, trace).await;
                }
                Try::Over(result, consumed) => (result, consumed),
            };
            // Until the response head (set by `Exchange::run`), as for HTTP/1.1 upstreams:
            // a long stream must not count as a slow server.
            let elapsed = trace.upstream_time.unwrap_or_else(|| started.elapsed());
            let metrics = worker
                .metrics
                .server(pool.slot, pool.server_slots[pick.server]);
            let head = ResponseHead {
                status: trace.status,
                ..ResponseHead::default()
            };
            let outcome = record_attempt(target, &pick, metrics, &result, &head, elapsed);
            let replay = Replay {
                idempotent: self.req.idempotent,
                buffered: !consumed,
                // A failure after relayed 1xx heads comes back as `Reached::Nothing` (the
                // caller still answers): the count of relayed heads tells.
                responded: self.relayed.any()
                    || result
                        .as_ref()
                        .err()
                        .is_some_and(|f| f.reached != Reached::Nothing),
            };
            if result.is_err() && may_retry(&u.retry.on, outcome, replay) {
                if let Some(next) =
                    worker
                        .upstreams
                        .retry(target.upstream_index, pool, u, key, &tried)
                {
                    tried.push(next.server);
                    if let Some(m) = worker.metrics.upstream(pool.slot) {
                        m.retries.inc();
                    }
                    pick = next;
                    continue;
                }
            }
            trace.upstream_time = Some(elapsed);
            drop(pick);
            return result;
        }
    }

    /// Sends the request to `server` on a pooled (or new) connection, again on another
    /// connection while the server refuses the stream unprocessed. `started`: when the
    /// try on this server began.
    async fn try_server(
        &self,
        facts: &H2Facts,
        (server, started): (&UpstreamServer, Instant),
        cookie: Option<HeaderValue>,
        (client, body): (&mut Option<Parts>, &mut Option<RecvStream>),
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Try {
        // The request goes to the first connection as it is, without a copy: h2 takes it
        // by value, and a refused stream (rare) has it built again from the head.
        let mut first = match self.upstream_request(facts, server, client.take()) {
            Ok(r) => Some(r),
            Err(e) => return Try::Over(Err(e.into()), false),
        };
        let tls = self.target.pool.tls.as_deref();
        let mut last = ProxyError::UpstreamClosed;
        for _ in 0..MAX_REFUSED {
            let pool = &self.worker.h2_pool;
            let to = (server, tls);
            let lease = match checkout(pool, self.target.upstream, to, started).await {
                Ok(Checkout::Lease(lease)) => lease,
                Ok(Checkout::Http1) => return Try::Http1,
                Err(e) => return Try::Over(Err(e.into()), false),
            };
            let request = match first
                .take()
                .map_or_else(|| self.upstream_request(facts, server, None), Ok)
            {
                Ok(r) => r,
                Err(e) => return Try::Over(Err(e.into()), false),
            };
            let end = body.is_none();
            let sent = unless_reset(respond, lease.send_request(request, end)).await;
            let (response, up_send) = match sent {
                Err(stop) => return Try::Over(Err(stopped(stop, trace)), false),
                // The connection takes no new streams (GOAWAY, closed): another one.
                Ok(Err(e)) => {
                    last = h2_error(&e);
                    continue;
                }
                Ok(Ok(pair)) => pair,
            };
            let consumed = Cell::new(0u64);
            let exchange = Exchange {
                r: self,
                facts,
                lease: &lease,
                consumed: &consumed,
                cookie: cookie.as_ref(),
                started,
            };
            let ran = exchange
                .run(body.as_mut(), response, up_send, respond, trace)
                .await;
            trace.body_in = consumed.get();
            match ran {
                Err(Refused) if consumed.get() == 0 => {
                    last = ProxyError::UpstreamClosed;
                    continue;
                }
                Err(Refused) => {
                    return Try::Over(Err(ProxyError::UpstreamClosed.into()), true);
                }
                Ok(result) => return Try::Over(result, consumed.get() > 0),
            }
        }
        Try::Over(Err(last.into()), false)
    }

    /// The upstream request: made from the client's request `client` when given (it is
    /// for the first one sent), else from the HTTP/1.1 head every request gets, as
    /// HTTP/2 fields.
    fn upstream_request(
        &self,
        facts: &H2Facts,
        server: &UpstreamServer,
        client: Option<Parts>,
    ) -> Result<http::Request<()>, ProxyError> {
        let tls = self.target.upstream.tls.is_some();
        let id = self.target.listener.policy.request_id.as_ref();
        let unindexed = id.map(|i| i.header.as_str());
        let Some(parts) = client else {
            let mut out = Vec::with_capacity(self.buf.len() + 256);
            self.write_head(&mut out, server);
            let scheme = if tls { "https" } else { "http" };
            return h1_head_to_h2(&out, scheme, facts.te_trailers, unindexed);
        };
        self.with_client_facts(|client| {
            let u = Upstream {
                buf: self.buf,
                req: self.req,
                path: self.path,
                route: self.target.route,
                server,
                client,
                scheme: if tls { Scheme::HTTPS } else { Scheme::HTTP },
                te_trailers: facts.te_trailers,
                unindexed,
            };
            upstream_request(parts, &u, &self.worker.h2_scratch)
        })
    }
}

/// An HTTP/1.1 request head (as Weir wrote it) as an HTTP/2 request. The field named
/// `unindexed` (the request id header: a new value on every request) is marked sensitive so
/// that the `h2` crate's HPACK encoder sends it as a literal never indexed: indexed, each
/// id was inserted into the connection's 4 KiB dynamic table and evicted the entries that
/// repeat (gRPC calls spent about 4.7k instructions per call in that table's upkeep).
pub(crate) fn h1_head_to_h2(
    head: &[u8],
    scheme: &str,
    te_trailers: bool,
    unindexed: Option<&str>,
) -> Result<http::Request<()>, ProxyError> {
    const BAD: ProxyError = ProxyError::BadRequest("request not expressible in HTTP/2");
    let count = head.split(|b| *b == b'\n').count();
    let mut fields = vec![httparse::EMPTY_HEADER; count];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(BAD);
    }
    let (Some(method), Some(path)) = (parsed.method, parsed.path) else {
        return Err(BAD);
    };
    let mut request = http::Request::new(());
    *request.method_mut() = http::Method::from_bytes(method.as_bytes()).map_err(|_| BAD)?;
    let mut authority = None;
    let headers = request.headers_mut();
    for f in parsed.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BAD)?;
        if name == http::header::HOST {
            authority = Some(f.value);
            continue;
        }
        if is_connection_specific(&name) {
            continue;
        }
        let mut value = HeaderValue::from_bytes(f.value).map_err(|_| BAD)?;
        if unindexed.is_some_and(|u| u.eq_ignore_ascii_case(f.name)) {
            value.set_sensitive(true);
        }
        headers.append(name, value);
    }
    if te_trailers {
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    let mut uri = http::Uri::builder().scheme(scheme).path_and_query(path);
    if let Some(a) = authority {
        uri = uri.authority(a);
    }
    *request.uri_mut() = uri.build().map_err(|_| BAD)?;
    *request.version_mut() = http::Version::HTTP_2;
    Ok(request)
}

/// Fields HTTP/2 forbids (RFC 9113 8.2.2); `te` is put back when it was `trailers`.
pub(crate) fn is_connection_specific(name: &HeaderName) -> bool {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    name == CONNECTION
        || name == TE
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// The server never processed the stream (it may be sent again).
struct Refused;

/// One stream on one upstream connection.
struct Exchange<'a, 'r> {
    r: &'a StreamRequest<'r>,
    facts: &'a H2Facts,
    lease: &'a Lease,
    /// Request body bytes taken from the client so far.
    consumed: &'a Cell<u64>,
    /// The sticky-session cookie to add to the response.
    cookie: Option<&'a HeaderValue>,
    /// When the try on this server began.
    started: Instant,
}

impl Exchange<'_, '_> {
    /// Uploads the body while waiting for the response head, then relays the response
    /// (and its trailers) while the upload goes on.
    async fn run(
        &self,
        body: Option<&mut RecvStream>,
        response: h2::client::ResponseFuture,
        mut up_send: SendStream<Bytes>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<Result<(), Failure>, Refused> {
        let r = self.r;
        let upstream = r.target.upstream;
        let timeout = match self.facts.grpc_timeout {
            Some(t) => t.min(upstream.response_timeout),
            None => upstream.response_timeout,
        };
        let client_timeout = r.target.listener.client_timeout;
        let limit = r.target.listener.max_body_size;
        let has_body = body.is_some();
        let upload = async {
            match body {
                Some(b) => {
                    upload(
                        b,
                        &mut up_send,
                        self.consumed,
                        limit,
                        (client_timeout, timeout),
                    )
                    .await
                }
                None => Ok(()),
            }
        };
        tokio::pin!(upload);
        let mut uploading = has_body;
        // The 1xx heads are relayed while waiting; the timeout covers them and the final.
        let head = {
            let client = r.client_stream(respond, has_body);
            let mut reset = &client;
            let bound = r.informational_bound();
            let head = with_timeout(timeout, final_h2_head(response, &client, bound));
            tokio::pin!(head);
            loop {
                let waited = unless_reset(&mut reset, async {
                    tokio::select! {
                        done = &mut upload, if uploading => Err(done),
                        head = &mut head => Ok(head),
                    }
                });
                match waited.await {
                    Err(stop) => return Ok(Err(stopped(stop, trace))),
                    Ok(Err(Ok(()))) => uploading = false,
                    Ok(Err(Err(e))) => return Ok(Err(e.into())),
                    Ok(Ok(Err(_))) => return Ok(Err(ProxyError::UpstreamTimeout.into())),
                    Ok(Ok(Ok(Err(NoFinalHead::TooManyInformational)))) => {
                        return Ok(Err(TOO_MANY_INFORMATIONAL.into()))
                    }
                    Ok(Ok(Ok(Err(NoFinalHead::H2(e))))) => {
                        if never_processed(&e) {
                            if e.is_go_away() {
                                self.lease.drain();
                            }
                            return Err(Refused);
                        }
                        return Ok(Err(h2_error(&e).into()));
                    }
                    Ok(Ok(Ok(Ok(head)))) => break head,
                }
            }
        };
        let (parts, mut up_body) = head.into_parts();
        trace.status = parts.status.as_u16();
        trace.upstream_time = Some(self.started.elapsed());
        let mut head = http::Response::from_parts(parts, ());
        r.edit_response(head.headers_mut());
        if let Some(cookie) = self.cookie {
            head.headers_mut()
                .append(http::header::SET_COOKIE, cookie.clone());
        }
        let grpc_status = trace.grpc_status_in(head.headers());
        let empty = up_body.is_end_stream();
        let mut send = match respond.send_response(head, empty) {
            Ok(send) => send,
            Err(_) => return Ok(Err(Failure::after_head(ProxyError::ClientClosed))),
        };
        trace.sent_grpc_status(grpc_status);
        if empty {
            return Ok(Ok(()));
        }
        // The relay waits for the client's window at most `stall_timeout`.
        let timeouts = (r.target.listener.http2.stall_timeout, timeout);
        let upload = uploading.then_some(upload);
        let relayed = relay_while_uploading(upload, &mut up_body, &mut send, trace, timeouts);
        let Err(stop) = relayed.await else {
            return Ok(Ok(()));
        };
        // Cut short: the client learns it from the reset (the upstream stream is reset
        // when its handles drop).
        send.send_reset(Reason::CANCEL);
        let mut failure = stopped(stop, trace);
        failure.reached = Reached::Head;
        Ok(Err(failure))
    }
}

/// Relays the response body and trailers while the rest of the request body (`upload`,
/// if still going) goes up; an upload failure stops both.
async fn relay_while_uploading(
    mut upload: Option<
        std::pin::Pin<&mut impl std::future::Future<Output = Result<(), ProxyError>>>,
    >,
    up_body: &mut RecvStream,
    send: &mut SendStream<Bytes>,
    trace: &mut Trace,
    timeouts: (Duration, Duration),
) -> Result<(), Stop> {
    let relay = relay(up_body, send, trace, timeouts);
    tokio::pin!(relay);
    loop {
        let uploading = upload.is_some();
        tokio::select! {
            done = async {
                match upload.as_mut() {
                    Some(u) => u.as_mut().await,
                    None => std::future::pending().await,
                }
            }, if uploading => {
                match done {
                    Ok(()) => upload = None,
                    Err(e) => return Err(Stop::Error(e)),
                }
            }
            done = &mut relay => return done,
        }
    }
}

fn stop_error(stop: Stop) -> ProxyError {
    match stop {
        Stop::Reset => ProxyError::ClientClosed,
        Stop::Error(e) => e,
    }
}

/// A failure from a client reset (marked in `trace`) or a failed wait.
fn stopped(stop: Stop, trace: &mut Trace) -> Failure {
    if stop == Stop::Reset {
        trace.reset = true;
    }
    stop_error(stop).into()
}

/// Sends the request's DATA upstream within the upstream's window, releasing each piece
/// to the client's window once sent; then the client's trailers, or the end of stream.
async fn upload(
    body: &mut RecvStream,
    up: &mut SendStream<Bytes>,
    consumed: &Cell<u64>,
    limit: Option<u64>,
    (client_timeout, upstream_timeout): (Duration, Duration),
) -> Result<(), ProxyError> {
    let up_error = |_: h2::Error| ProxyError::UpstreamClosed;
    loop {
        let data = match with_timeout(client_timeout, body.data()).await {
            Err(_) => return Err(ProxyError::ClientTimeout),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(ProxyError::ClientClosed),
            Ok(Some(Ok(data))) => data,
        };
        let len = data.len();
        let first = consumed.get() == 0;
        consumed.set(consumed.get() + len as u64);
        if limit.is_some_and(|max| consumed.get() > max) {
            return Err(ProxyError::BodyTooLarge);
        }
        // The client's last DATA (END_STREAM, no trailers): END_STREAM goes on ours too,
        // not on an extra empty frame.
        let last = body.is_end_stream();
        let eager = first.then_some(EAGER_FIRST_PIECE);
        send_windowed(up, data, (upstream_timeout, eager), last).await?;
        // Only now may the client send more: its pace is the upstream's.
        let _ = body.flow_control().release_capacity(len);
        if last {
            return Ok(());
        }
    }
    match with_timeout(client_timeout, body.trailers()).await {
        Err(_) => Err(ProxyError::ClientTimeout),
        Ok(Err(_)) => Err(ProxyError::ClientClosed),
        Ok(Ok(Some(trailers))) => up.send_trailers(trailers).map_err(up_error),
        Ok(Ok(None)) => up.send_data(Bytes::new(), true).map_err(up_error),
    }
}

/// The first DATA of a request up to this size goes upstream without waiting for the
/// stream's window (see `send_windowed`). Small (a gRPC call's message usually fits), as it
/// is released to the client's window before h2 sent it: at most this much per stream
/// (128 KiB per connection at the default `max_concurrent_streams`) waits in Weir beyond
/// the client's windows.
const EAGER_FIRST_PIECE: usize = 1024;

/// Sends `data` upstream as DATA, never more than the stream's window allows: h2 would
/// buffer the rest, so waiting for the window is what bounds memory per stream. `end`
/// puts END_STREAM on the last frame. `eager`: `data`, if no larger, is the stream's
/// first piece and is handed to h2 at once. A new stream has no window before the
/// connection task has sent its HEADERS, so waiting for it cost every small request (a
/// gRPC call) a timer and a second poll of its task; h2 holds that one piece until the
/// window opens, and the next piece waits for window as usual (h2 counts what it holds),
/// so a stream still holds at most this much more than its window.
pub(crate) async fn send_windowed(
    up: &mut SendStream<Bytes>,
    mut rest: Bytes,
    (upstream_timeout, eager): (Duration, Option<usize>),
    end: bool,
) -> Result<(), ProxyError> {
    let up_error = |_: h2::Error| ProxyError::UpstreamClosed;
    let eager = eager.is_some_and(|max| !rest.is_empty() && rest.len() <= max);
    if eager || (rest.is_empty() && end) {
        return up.send_data(rest, end).map_err(up_error);
    }
    while !rest.is_empty() {
        up.reserve_capacity(rest.len());
        let window = with_timeout(upstream_timeout, poll_fn(|cx| up.poll_capacity(cx)));
        let n = match window.await {
            Err(_) => return Err(ProxyError::UpstreamTimeout),
            Ok(None) => return Err(ProxyError::UpstreamClosed),
            Ok(Some(r)) => r.map_err(up_error)?,
        };
        let piece = rest.split_to(n.min(rest.len()));
        up.send_data(piece, end && rest.is_empty())
            .map_err(up_error)?;
    }
    Ok(())
}

/// Streams the upstream's response DATA to the client, then its trailers.
async fn relay(
    up: &mut RecvStream,
    send: &mut SendStream<Bytes>,
    trace: &mut Trace,
    (stall_timeout, upstream_timeout): (Duration, Duration),
) -> Result<(), Stop> {
    let read_error = |e: h2::Error| Stop::Error(h2_error(&e));
    loop {
        let next = unless_reset(send, with_timeout(upstream_timeout, up.data())).await?;
        let data = match next {
            Err(_) => return Err(Stop::Error(ProxyError::UpstreamTimeout)),
            Ok(None) => break,
            Ok(Some(data)) => data.map_err(read_error)?,
        };
        let len = data.len();
        send_bytes(send, data, false, stall_timeout).await?;
        trace.body_out += len as u64;
        let _ = up.flow_control().release_capacity(len);
    }
    let trailers = unless_reset(send, with_timeout(upstream_timeout, up.trailers())).await?;
    match trailers {
        Err(_) => Err(Stop::Error(ProxyError::UpstreamTimeout)),
        Ok(Err(e)) => Err(read_error(e)),
        Ok(Ok(Some(t))) => {
            let grpc_status = trace.grpc_status_in(&t);
            send.send_trailers(t)
                .map_err(|_| Stop::Error(ProxyError::ClientClosed))?;
            trace.sent_grpc_status(grpc_status);
            Ok(())
        }
        Ok(Ok(None)) => send_data(send, &[], true, stall_timeout).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_grpc_and_its_lookalikes_are_not() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_grpc_content_type(yes.as_bytes()), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web-text+proto",
            "application/grpcfoo",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc_content_type(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn facts_take_the_first_value_of_each_field() {
        let req = http::Request::post("http://e/")
            .header("grpc-timeout", "150m")
            .header("content-type", "application/grpc+proto")
            .header("te", "trailers")
            .header("x-other", "1")
            .header("te", "gzip")
            .header("grpc-timeout", "1H")
            .header("content-type", "text/plain")
            .body(())
            .unwrap_or_default();
        let facts = H2Facts::of(req.headers());
        assert!(facts.te_trailers && facts.grpc);
        assert_eq!(facts.grpc_timeout, Some(Duration::from_millis(150)));
        let req = http::Request::get("http://e/")
            .header("content-type", "application/grpc-web")
            .header("te", "gzip")
            .body(())
            .unwrap_or_default();
        let facts = H2Facts::of(req.headers());
        assert!(!facts.te_trailers && !facts.grpc && facts.grpc_timeout.is_none());
    }

    #[test]
    fn parses_grpc_timeouts() {
        let ms = Duration::from_millis;
        assert_eq!(grpc_timeout(b"150m"), Some(ms(150)));
        assert_eq!(grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout(b"9n"), Some(Duration::from_nanos(9)));
        for bad in [
            &b""[..],
            b"m",
            b"10",
            b"10x",
            b"123456789m",
            b"-1m",
            b"1.5S",
        ] {
            assert_eq!(
                grpc_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn h1_head_becomes_h2_fields_without_connection_specific_ones() {
        let head = b"POST /a/b?c=d HTTP/1.1\r\nHost: up.test:8080\r\nConnection: keep-alive\r\n\
            Keep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nUpgrade: x\r\nTE: trailers\r\n\
            Content-Type: application/grpc\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n";
        let request = h1_head_to_h2(head, "http", true, None).expect("translated");
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri().to_string(), "http://up.test:8080/a/b?c=d");
        let names: Vec<&str> = request.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-forwarded-for", "te"]);
        assert_eq!(request.headers()["te"], "trailers");
        let without_te = h1_head_to_h2(head, "https", false, None).expect("translated");
        assert!(without_te.headers().get("te").is_none());
        assert_eq!(without_te.uri().scheme_str(), Some("https"));
    }

    #[test]
    fn request_id_is_marked_never_indexed_and_nothing_else() {
        let head = b"GET / HTTP/1.1\r\nHost: up.test\r\nX-Request-Id: 4f1c-0001\r\n\
            X-Trace: a\r\n\r\n";
        let request = h1_head_to_h2(head, "http", false, Some("x-request-ID")).expect("h2");
        assert!(request.headers()["x-request-id"].is_sensitive());
        assert_eq!(request.headers()["x-request-id"], "4f1c-0001");
        assert!(!request.headers()["x-trace"].is_sensitive());
        let off = h1_head_to_h2(head, "http", false, None).expect("h2");
        assert!(!off.headers()["x-request-id"].is_sensitive());
    }
}
