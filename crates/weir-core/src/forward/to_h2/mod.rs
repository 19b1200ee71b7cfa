//! HTTP/1.x client requests to HTTP/2 upstreams (`protocol = "h2"` / `"h2c"`).
//!
//! The request is the HTTP/1.1 head `forward` writes for any upstream (route rules,
//! forwarding headers, rewrites, `Host`), turned into HTTP/2 fields by
//! `http2::h1_head_to_h2` (connection-specific fields dropped, `Host` to `:authority`,
//! `te: trailers` kept when the client sent it). The body is sent as DATA under the
//! upstream's flow control (`request_body`); the response comes back as HTTP/1.1
//! (`response`). The stream rides the worker's multiplexed `connector::h2` pool, the same
//! connections HTTP/2 clients' streams use.
//!
//! Server pick, load balancing, passive health, retries on other servers, metrics and the
//! access log are those of HTTP/1.1 upstreams. A stream the server never processed
//! (REFUSED_STREAM, above a GOAWAY's last stream id, or a connection that stopped taking
//! streams) goes again on another connection when its body can be sent again. Upgrades
//! (WebSocket) cannot be carried to an HTTP/2-only server by an HTTP/1.1 client's
//! request: they are refused with 501.

mod request_body;
mod response;

use std::cell::Cell;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::ResponseFuture;
use h2::SendStream;
use weir_config::{Upstream, UpstreamProtocol, UpstreamServer};

use self::request_body::{RequestBody, UploadError};
use self::response::{final_head, relay, write_head, Ask, Head, HeadError};
use super::exchange::{
    host_names_server, pick_and_write_head, record_attempt, TOO_MANY_INFORMATIONAL,
};
use super::{Failure, Reached, Target};
use crate::client::ClientConn;
use crate::codec::http1::{HeaderKind, RequestHead, ResponseHead};
use crate::connector::h2::{checkout, h2_error, never_processed, Checkout, Lease};
use crate::error::ProxyError;
use crate::http2::h1_head_to_h2;
use crate::upstream::retry::{may_retry, Replay, Tried};
use crate::upstream::{Pick, RequestKey};
use crate::worker::Worker;

/// Most tries on new connections while a server refuses the stream unprocessed.
const MAX_REFUSED: usize = 5;

/// Whether HTTP/1.x clients' requests to this upstream are translated to HTTP/2. `auto`
/// is not: a server that offers ALPN `http/1.1` takes them as they are.
pub fn translates(upstream: &Upstream) -> bool {
    matches!(
        upstream.protocol,
        UpstreamProtocol::H2 | UpstreamProtocol::H2c
    )
}

/// Whether the client sent `TE` with the `trailers` token.
fn te_trailers(buf: &[u8], req: &RequestHead) -> bool {
    req.headers
        .iter()
        .filter(|h| h.kind == HeaderKind::Te)
        .any(|h| {
            buf[h.value.clone()]
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
        })
}

/// The request, prepared once for every attempt.
struct Prepared<'a> {
    worker: &'a Worker,
    target: Target<'a>,
    request: http::Request<()>,
    ask: Ask,
    keep_alive: bool,
    idempotent: bool,
    /// The client sent no `Host`: retries rename the authority to the next server.
    client_host_empty: bool,
}

/// Forwards the request whose head is at the start of `conn.buf` to an HTTP/2 upstream.
/// Returns whether the client connection stays open.
pub async fn forward(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
) -> Result<bool, Failure> {
    let (key, pick, upgrade) = pick_and_write_head(worker, target, conn, req)?;
    if !upgrade.is_empty() {
        return Err(ProxyError::NotImplemented("upgrade to an HTTP/2-only upstream").into());
    }
    let te = te_trailers(conn.buf.filled(), req);
    let scheme = if target.upstream.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let id = target.listener.policy.request_id.as_ref();
    let mut request = h1_head_to_h2(&conn.out, scheme, te, id.map(|i| i.header.as_str()))?;
    conn.buf.consume(req.head_len);
    let limit = target.listener.max_body_size;
    let body = RequestBody::new(req.framing, limit, &mut conn.buf)?;
    if req.expect_continue && !body.is_whole() {
        // The client waits for 100 before sending its body: Weir reads it at once, so it
        // says so itself (an HTTP/2 server need not answer `expect`).
        request.headers_mut().remove(http::header::EXPECT);
        super::body::write_all(
            &mut conn.stream,
            b"HTTP/1.1 100 Continue\r\n\r\n",
            &[],
            target.listener.client_timeout,
        )
        .await
        .map_err(|_| ProxyError::ClientClosed)?;
    }
    let prepared = Prepared {
        worker,
        target,
        request,
        ask: Ask {
            is_head: req.is_head,
            http10: req.minor_version == 0,
            te_trailers: te,
            max_informational: target.listener.max_informational,
        },
        keep_alive,
        idempotent: req.idempotent,
        client_host_empty: req.host.is_none(),
    };
    prepared.run(key, pick, body, conn, resp).await
}

impl Prepared<'_> {
    /// Tries the picked server, then others while `upstream::retry` deems it safe.
    async fn run(
        mut self,
        key: RequestKey,
        mut pick: Pick,
        mut body: RequestBody,
        conn: &mut ClientConn,
        resp: &mut ResponseHead,
    ) -> Result<bool, Failure> {
        let (worker, target) = (self.worker, self.target);
        let (u, pool) = (target.upstream, target.pool);
        let mut tried = Tried::new(pick.server);
        loop {
            let server = &u.servers[pick.server];
            conn.upstream_pick = Some((target.upstream_index, pick.server));
            conn.upstream_time = None;
            let started = Instant::now();
            let cookie = pool.set_cookie(pick.server).filter(|_| pick.set_cookie);
            let consumed = Cell::new(0u64);
            let attempt = Attempt {
                p: &self,
                server,
                cookie,
                consumed: &consumed,
                started,
            };
            let result = attempt.on_server(&mut body, conn, resp).await;
            let elapsed = conn.upstream_time.unwrap_or_else(|| started.elapsed());
            let metrics = worker
                .metrics
                .server(pool.slot, pool.server_slots[pick.server]);
            let outcome = record_attempt(target, &pick, metrics, &result, resp, elapsed);
            let replay = Replay {
                idempotent: self.idempotent,
                buffered: body.is_whole() || consumed.get() == 0,
                responded: result
                    .as_ref()
                    .is_err_and(|f| f.reached != Reached::Nothing),
            };
            if result.is_err() && may_retry(&u.retry.on, outcome, replay) {
                if let Some(next) =
                    worker
                        .upstreams
                        .retry(target.upstream_index, pool, u, key, &tried)
                {
                    let next_name = &u.servers[next.server].name;
                    if self.retarget(&server.name, next_name) {
                        tried.push(next.server);
                        if let Some(m) = worker.metrics.upstream(pool.slot) {
                            m.retries.inc();
                        }
                        pick = next;
                        continue;
                    }
                }
            }
            conn.upstream_time = Some(elapsed);
            conn.request_read = body.is_read();
            drop(pick);
            return result;
        }
    }

    /// Points the request at `next` when its authority names the server that failed.
    /// False when it cannot be (the request is not retried, as for HTTP/1.1 upstreams).
    fn retarget(&mut self, failed: &str, next: &str) -> bool {
        if !host_names_server(self.target.route, self.client_host_empty) {
            return true;
        }
        let uri = self.request.uri();
        if uri.authority().map(|a| a.as_str()) != Some(failed) {
            return false;
        }
        let mut parts = uri.clone().into_parts();
        parts.authority = next.parse().ok();
        match http::Uri::from_parts(parts) {
            Ok(uri) => {
                *self.request.uri_mut() = uri;
                true
            }
            Err(_) => false,
        }
    }
}

/// One try on one server (on as many of its connections as refuse the stream unprocessed).
struct Attempt<'a> {
    p: &'a Prepared<'a>,
    server: &'a UpstreamServer,
    /// The sticky-session `Set-Cookie` line to add to the response.
    cookie: Option<&'a [u8]>,
    /// Request body bytes taken from the client.
    consumed: &'a Cell<u64>,
    started: Instant,
}

/// The server never processed the stream: it may go again.
struct Refused;

impl Attempt<'_> {
    async fn on_server(
        &self,
        body: &mut RequestBody,
        conn: &mut ClientConn,
        resp: &mut ResponseHead,
    ) -> Result<bool, Failure> {
        let p = self.p;
        let tls = p.target.pool.tls.as_deref();
        let mut last = ProxyError::UpstreamClosed;
        for _ in 0..MAX_REFUSED {
            let pool = &p.worker.h2_pool;
            let to = (self.server, tls);
            let lease = match checkout(pool, p.target.upstream, to, self.started).await? {
                Checkout::Lease(lease) => lease,
                // Only `auto` upstreams fall back, and they are not translated.
                Checkout::Http1 => {
                    return Err(ProxyError::UpstreamTls("the server chose HTTP/1.1").into())
                }
            };
            let (response, up_send) =
                match lease.send_request(p.request.clone(), body.is_empty()).await {
                    Ok(pair) => pair,
                    // The connection takes no new streams (GOAWAY, closed): another one.
                    Err(e) => {
                        last = h2_error(&e);
                        continue;
                    }
                };
            match self
                .exchange(&lease, response, up_send, body, conn, resp)
                .await
            {
                Err(Refused) if body.is_whole() || self.consumed.get() == 0 => {
                    last = ProxyError::UpstreamClosed;
                }
                Err(Refused) => return Err(ProxyError::UpstreamClosed.into()),
                Ok(result) => return result,
            }
        }
        Err(last.into())
    }

    /// Uploads the body while waiting for the final head (relaying 1xx), then writes the
    /// head and relays the body while the upload goes on.
    async fn exchange(
        &self,
        lease: &Lease,
        mut response: ResponseFuture,
        mut up_send: SendStream<Bytes>,
        body: &mut RequestBody,
        conn: &mut ClientConn,
        resp: &mut ResponseHead,
    ) -> Result<Result<bool, Failure>, Refused> {
        let p = self.p;
        let (listener, upstream) = (p.target.listener, p.target.upstream);
        let timeouts = (listener.client_timeout, upstream.response_timeout);
        let (mut cr, mut cw) = match conn.stream.split() {
            Ok(halves) => halves,
            Err(e) => return Ok(Err(ProxyError::client_io(e).into())),
        };
        let mut upload_state = if body.is_empty() {
            UploadState::Done
        } else {
            UploadState::Running
        };
        let upload = body.upload(
            &mut cr,
            &mut conn.buf,
            &mut up_send,
            self.consumed,
            timeouts,
        );
        tokio::pin!(upload);
        let mut interim = false;
        let head = {
            let head = final_head(
                &mut response,
                &mut cw,
                p.ask,
                listener.client_timeout,
                &mut interim,
            );
            let waited = wait_head(
                upload.as_mut(),
                &mut upload_state,
                head,
                upstream.response_timeout,
            );
            match waited.await {
                Ok(head) => head,
                Err(Waited::Failed(error)) => {
                    let reached = if interim {
                        Reached::Interim
                    } else {
                        Reached::Nothing
                    };
                    return Ok(Err(Failure { error, reached }));
                }
                Err(Waited::H2(e)) if never_processed(&e) && !interim => {
                    if e.is_go_away() {
                        lease.drain();
                    }
                    return Err(Refused);
                }
                Err(Waited::H2(e)) => {
                    let reached = if interim {
                        Reached::Interim
                    } else {
                        Reached::Nothing
                    };
                    return Ok(Err(Failure {
                        error: h2_error(&e),
                        reached,
                    }));
                }
            }
        };
        let (parts, mut up_body) = head.into_parts();
        resp.status = parts.status.as_u16();
        conn.upstream_time = Some(self.started.elapsed());
        let route = p.target.route;
        let edits = route
            .filters
            .response_headers
            .as_ref()
            .map(|r| (r, &conn.resp_lines[..]));
        let head = Head {
            ask: p.ask,
            end_stream: up_body.is_end_stream(),
            keep_alive: p.keep_alive,
            edits,
            set_cookie: self.cookie,
        };
        conn.out.clear();
        let (framing, keep_alive) = write_head(&mut conn.out, &parts, &head);
        let written =
            super::body::write_all(&mut cw, &conn.out, &[], listener.client_timeout).await;
        if written.is_err() {
            return Ok(Err(Failure::after_head(ProxyError::ClientClosed)));
        }
        conn.sent += conn.out.len() as u64;
        let relayed = async {
            match framing {
                response::Framing::Empty => Ok(()),
                _ => {
                    relay(
                        &mut up_body,
                        &mut cw,
                        (framing, p.ask.te_trailers),
                        &mut conn.sent,
                        timeouts,
                    )
                    .await
                }
            }
        };
        let upload = (upload_state == UploadState::Running).then_some(upload);
        let done = relay_while_uploading(upload, relayed).await;
        Ok(match done {
            Err(error) => Err(Failure::after_head(error)),
            // A request body the client is still sending cannot be skipped: close.
            Ok(request_done) => {
                Ok(keep_alive && request_done && upload_state != UploadState::Stopped)
            }
        })
    }
}

/// Where the upload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UploadState {
    Running,
    /// The whole body went up.
    Done,
    /// The server stopped taking it: the client connection cannot be reused.
    Stopped,
}

/// Why no final head came.
enum Waited {
    Failed(ProxyError),
    H2(h2::Error),
}

/// Runs the upload and the wait for the final head together. `response_timeout` counts
/// from the end of the upload, as for HTTP/1.1 upstreams.
async fn wait_head<U, H>(
    mut upload: std::pin::Pin<&mut U>,
    state: &mut UploadState,
    head: H,
    response_timeout: Duration,
) -> Result<http::Response<h2::RecvStream>, Waited>
where
    U: std::future::Future<Output = Result<(), UploadError>>,
    H: std::future::Future<Output = Result<http::Response<h2::RecvStream>, HeadError>>,
{
    let running = *state == UploadState::Running;
    let timer = tokio::time::sleep(if running {
        Duration::MAX
    } else {
        response_timeout
    });
    tokio::pin!(head, timer);
    loop {
        let running = *state == UploadState::Running;
        tokio::select! {
            r = upload.as_mut(), if running => {
                timer.as_mut().reset(tokio::time::Instant::now() + response_timeout);
                *state = match r {
                    Ok(()) => UploadState::Done,
                    Err(UploadError::Upstream) => UploadState::Stopped,
                    Err(UploadError::Client(e)) => return Err(Waited::Failed(e)),
                };
            }
            h = &mut head => return h.map_err(|e| match e {
                HeadError::H2(e) => Waited::H2(e),
                HeadError::Client => Waited::Failed(ProxyError::ClientClosed),
                HeadError::TooManyInformational => Waited::Failed(TOO_MANY_INFORMATIONAL),
                HeadError::NameNotToken => Waited::Failed(ProxyError::UpstreamMalformed(
                    "field name is not a token",
                )),
            }),
            () = &mut timer, if !running => return Err(Waited::Failed(ProxyError::UpstreamTimeout)),
        }
    }
}

/// Relays the response while the rest of the request body goes up. Returns whether the
/// whole request body was sent.
async fn relay_while_uploading<U, R>(
    upload: Option<std::pin::Pin<&mut U>>,
    relay: R,
) -> Result<bool, ProxyError>
where
    U: std::future::Future<Output = Result<(), UploadError>>,
    R: std::future::Future<Output = Result<(), ProxyError>>,
{
    let Some(mut upload) = upload else {
        return relay.await.map(|()| true);
    };
    tokio::pin!(relay);
    let mut uploading = true;
    loop {
        tokio::select! {
            r = upload.as_mut(), if uploading => match r {
                Ok(()) => uploading = false,
                Err(UploadError::Client(e)) => return Err(e),
                // The server took no more (it may have answered already): the relay goes on.
                Err(UploadError::Upstream) => return relay.await.map(|()| false),
            },
            r = &mut relay => return r.map(|()| !uploading),
        }
    }
}
