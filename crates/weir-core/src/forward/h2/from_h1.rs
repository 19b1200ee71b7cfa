//! An HTTP/1.x client's request to an HTTP/2 upstream (`protocol = "h2"` / `"h2c"`).
//!
//! Each try writes the HTTP/1.1 head every upstream gets, for its server, and sends it as
//! HTTP/2 fields (`h1_head_to_h2`); the body goes as DATA under the upstream's flow control
//! (`request_body`); the response comes back as HTTP/1.1 (`response`). Upgrades
//! (WebSocket) cannot be carried to an HTTP/2-only server by an HTTP/1.1 client's request:
//! they are refused with 501.

use std::cell::Cell;
use std::mem::take;

use super::request_body::RequestBody;
use super::response::{relay, write_head, Ask, Framing, Head};
use super::{final_head, h1_head_to_h2, open, relay_while_uploading, HeadBounds, Upload};
use crate::client::ClientConn;
use crate::codec::http1::{HeaderKind, RequestHead, ResponseHead};
use crate::error::ProxyError;
use crate::forward::driver::{drive, Attempt, Exchange, Miss, Sender, Tries};
use crate::forward::h1::Http1Interim;
use crate::forward::request_head::{render_response_rules, write_upstream_head};
use crate::forward::{body, Failure, Target, Timeouts};
use crate::upstream::RequestKey;
use crate::worker::Worker;

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

/// Forwards the request whose head is at the start of `conn.buf` to an HTTP/2 upstream.
/// Returns whether the client connection stays open.
pub(crate) async fn forward_h2(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
) -> Result<bool, Failure> {
    let buf = conn.buf.filled();
    let path = conn.path.get(req.path(buf));
    let key = RequestKey::new(&target.upstream.lb, buf, req, path, conn.client_text());
    let limit = target.listener.max_body_size;
    let body = RequestBody::new(req.framing, limit, buf, req.head_len)?;
    let te = te_trailers(buf, req);
    let expect = req.expect_continue && !body.is_whole();
    if expect {
        // The client waits for 100 before sending its body: Weir reads it at once, so it
        // says so itself (an HTTP/2 server need not answer `expect`).
        let go_on = b"HTTP/1.1 100 Continue\r\n\r\n";
        let timeout = target.listener.client_timeout;
        body::write_all(&mut conn.stream, go_on, &[], timeout)
            .await
            .map_err(|_| ProxyError::ClientClosed)?;
    }
    let x = Exchange {
        worker,
        target,
        key,
        idempotent: req.idempotent,
    };
    let mut last_try = conn.last_try;
    let started = conn.request_started;
    let mut sender = FromHttp1 {
        x: &x,
        conn,
        req,
        body,
        consumed: Cell::new(0),
        ask: Ask {
            is_head: req.is_head,
            http10: req.minor_version == 0,
            te_trailers: te,
        },
        expect,
        keep_alive,
        resp,
    };
    let relayed = drive(&x, &mut sender, started, &mut last_try).await;
    let FromHttp1 { conn, body, .. } = sender;
    conn.last_try = last_try;
    // The request is consumed once answered (a streamed body consumed it as it went).
    conn.buf.consume(body.skip());
    conn.request_read = body.is_read();
    relayed.and_then(|accepted| accepted.take().0)
}

/// Sends an HTTP/1.x client's request as HTTP/2 streams, and relays the response.
struct FromHttp1<'x, 'c> {
    x: &'x Exchange<'x>,
    conn: &'c mut ClientConn,
    req: &'c RequestHead,
    body: RequestBody,
    /// Request body bytes taken from the client.
    consumed: Cell<u64>,
    ask: Ask,
    /// Weir answered `expect: 100-continue` itself: the field is not sent on.
    expect: bool,
    keep_alive: bool,
    resp: &'c mut ResponseHead,
}

impl Sender for FromHttp1<'_, '_> {
    /// Whether the client connection stays open, or how the relay failed.
    type Sent = Result<bool, Failure>;

    async fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> Result<Result<bool, Failure>, Miss> {
        let request = self.request(a)?;
        let x = self.x;
        let Some((pending, mut send)) = open(x, a, request, self.body.is_empty()).await? else {
            // Only `auto` upstreams fall back, and HTTP/1.x clients do not take them to h2.
            return Err(ProxyError::UpstreamTls("the server chose HTTP/1.1").into());
        };
        let conn = &mut *self.conn;
        let (listener, upstream) = (x.target.listener, x.target.upstream);
        let timeouts = Timeouts {
            client: listener.client_timeout,
            upstream: upstream.response_timeout,
        };
        let (mut cr, mut cw) = conn.stream.split().map_err(ProxyError::client_io)?;
        let mut state = match self.body.is_empty() {
            true => Upload::Done,
            false => Upload::Running,
        };
        let (buf, consumed) = (&mut conn.buf, &self.consumed);
        let whole = self.body.is_whole();
        let upload = self
            .body
            .upload(&mut cr, buf, &mut send, consumed, timeouts);
        tokio::pin!(upload);
        let bounds = HeadBounds {
            timeout: upstream.response_timeout,
            max_informational: listener.max_informational,
            relay: !self.ask.http10,
            tokens: true,
        };
        let mut interim = Http1Interim {
            writer: &mut cw,
            timeout: listener.client_timeout,
        };
        // An HTTP/1.x client is not watched while it waits (it cannot cancel a request).
        let gone = std::future::pending();
        let waited = final_head(
            pending,
            upload.as_mut(),
            &mut state,
            &mut interim,
            bounds,
            gone,
        );
        let (head, _lease) = waited.await?;
        let (parts, mut up_body) = head.into_parts();
        let status = parts.status.as_u16();
        self.resp.status = status;
        if !tries.relays(status, whole || self.consumed.get() == 0, false) {
            return Err(Miss::retried(status));
        }
        tries.count(a, Ok(status));
        let edits = x.target.route.filters.response_headers.as_ref();
        let head = Head {
            ask: self.ask,
            end_stream: up_body.is_end_stream(),
            keep_alive: self.keep_alive,
            edits: edits.map(|r| (r, &conn.resp_lines[..])),
            set_cookie: tries.set_cookie(),
        };
        conn.out.clear();
        let (framing, keep_alive) = write_head(&mut conn.out, &parts, &head);
        let written = body::write_all(&mut cw, &conn.out, &[], timeouts.client).await;
        if written.is_err() {
            return Ok(Err(Failure::after_head(ProxyError::ClientClosed)));
        }
        conn.sent += conn.out.len() as u64;
        let sent = &mut conn.sent;
        let trailers = self.ask.te_trailers;
        let relayed = async {
            match framing {
                Framing::Empty => Ok(()),
                _ => relay(&mut up_body, &mut cw, framing, trailers, sent, timeouts).await,
            }
        };
        let upload = (state == Upload::Running).then_some(upload);
        Ok(match relay_while_uploading(upload, relayed).await {
            Err(error) => Err(Failure::after_head(error)),
            // A request body the client is still sending cannot be skipped: close.
            Ok(request_done) => Ok(keep_alive && request_done && state != Upload::Stopped),
        })
    }

    fn replayable(&self) -> bool {
        self.body.is_whole() || self.consumed.get() == 0
    }

    fn responded(&self) -> bool {
        false
    }
}

impl FromHttp1<'_, '_> {
    /// The request for try `a`: the head written for its server, as HTTP/2 fields.
    fn request(&mut self, a: &Attempt<'_>) -> Result<http::Request<()>, Miss> {
        let (target, conn) = (&self.x.target, &mut *self.conn);
        let (mut out, mut lines) = (take(&mut conn.out), take(&mut conn.resp_lines));
        out.clear();
        let r = conn.request(self.req);
        let offered = write_upstream_head(&mut out, &r, &conn.path, target, a.server);
        render_response_rules(&mut lines, &r, target.route);
        (conn.out, conn.resp_lines) = (out, lines);
        if !offered.is_empty() {
            return Err(ProxyError::NotImplemented("upgrade to an HTTP/2-only upstream").into());
        }
        let scheme = match target.upstream.tls {
            Some(_) => "https",
            None => "http",
        };
        let id = target.listener.policy.request_id.as_ref();
        let te = self.ask.te_trailers;
        let mut request = h1_head_to_h2(&conn.out, scheme, te, id.map(|i| i.header.as_str()))?;
        if self.expect {
            request.headers_mut().remove(http::header::EXPECT);
        }
        Ok(request)
    }
}
