//! An HTTP/1.x client's request to an HTTP/2 upstream (`protocol = "h2"` / `"h2c"`).
//!
//! Each try writes the HTTP/1.1 head every upstream gets, for its server, and sends it as
//! HTTP/2 fields (`h1_head_to_h2`); the body goes as DATA under the upstream's flow control
//! (`request_body`); the response comes back as HTTP/1.1 (`response`). Upgrades
//! (WebSocket) cannot be carried to an HTTP/2-only server by an HTTP/1.1 client's request:
//! they are refused with 501.

use std::cell::Cell;

use super::request_body::RequestBody;
use super::{
    final_head, forbidden_in_trailer, h2_request, open, plan_h2, relay_while_uploading, HeadBounds,
    Upload,
};
use crate::cache::Fetched::Http2;
use crate::cache::{Fill, Recorder};
use crate::client::ClientConn;
use crate::codec::http1::header::is_token;
use crate::codec::http1::{HeaderKind, RequestHead, ResponseHead};
use crate::error::ProxyError;
use crate::files::{send_http1, Reply, Under};
use crate::forward::body;
use crate::forward::driver::{drive, Attempt, Exchange, Miss, Sender, Tries};
use crate::forward::exchange::{push_before_end, write_heads, Http1Request};
use crate::forward::filling::{relay_recorded, Record};
use crate::forward::h1::Http1Interim;
use crate::forward::head::{write_from_h2, Edits, ForClient, Framing};
use crate::forward::relay::{Broke, Coding, H2Source, Http1Sink, Peer, Sink, Trailers};
use crate::forward::{Failure, Timeouts};

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
    x: &Exchange<'_>,
    client: Http1Request<'_>,
) -> Result<bool, Failure> {
    let Http1Request {
        conn,
        req,
        resp,
        meta,
        keep_alive,
    } = client;
    let buf = conn.buf.filled();
    let listener = x.target.listener;
    let body = RequestBody::new(req.framing, listener.max_body_size, buf, req.head_len)?;
    let te = te_trailers(buf, req);
    let expect = req.expect_continue && !body.is_whole();
    let mut last_try = conn.current.last_try;
    let started = conn.current.started;
    // A streamed upload consumes the head from the buffer: another try writes its request
    // from this copy (one per streamed upload, none for a body at hand).
    let head = match body.is_whole() {
        true => Vec::new(),
        false => conn.buf.filled()[..req.head_len].to_vec(),
    };
    let mut sender = FromHttp1 {
        x,
        conn,
        req,
        head,
        body,
        consumed: Cell::new(0),
        client: ForClient {
            is_head: meta.is_head,
            http10: meta.http10,
            te_trailers: te,
            accepted: meta.accepted,
            end_stream: false,
            keep_alive,
        },
        expect,
        informed: false,
        resp,
    };
    let relayed = drive(x, &mut sender, started, &mut last_try).await;
    let FromHttp1 {
        conn, body, resp, ..
    } = sender;
    conn.current.last_try = last_try;
    // The request is consumed once answered (a streamed body consumed it as it went).
    conn.buf.consume(body.skip());
    conn.current.read = body.is_read();
    let reply = match relayed.map(|accepted| accepted.take().0)? {
        Ended::Relayed(relayed) => return relayed,
        Ended::Stored(reply) => reply,
    };
    let to = meta.sending(keep_alive && conn.current.read);
    send_http1(conn, Under::of_target(&x.target), *reply, to, resp).await?;
    Ok(to.keep_alive)
}

/// How the accepted try ended.
enum Ended {
    /// The response was relayed: whether the client connection stays open, or how the
    /// relay failed.
    Relayed(Result<bool, Failure>),
    /// A route cache's entry answers instead of the response (a `304` that refreshed it,
    /// a 5xx it answers for).
    Stored(Box<Reply>),
}

/// Sends an HTTP/1.x client's request as HTTP/2 streams, and relays the response.
struct FromHttp1<'x, 'c> {
    x: &'x Exchange<'x>,
    conn: &'c mut ClientConn,
    req: &'c RequestHead,
    /// The client's head, for a streamed body (empty: it stays in `conn.buf`).
    head: Vec<u8>,
    body: RequestBody,
    /// Above zero once request body bytes are taken from the client.
    consumed: Cell<u64>,
    /// What the client asked that shapes the response (`end_stream` is each try's).
    client: ForClient,
    /// Weir answered `expect: 100-continue` itself: the field is not sent on.
    expect: bool,
    /// The client has a 1xx head (Weir's 100 Continue, or one relayed).
    informed: bool,
    resp: &'c mut ResponseHead,
}

impl Sender for FromHttp1<'_, '_> {
    type Sent = Ended;

    async fn send(&mut self, a: &Attempt<'_>, tries: &mut Tries<'_>) -> Result<Ended, Miss> {
        let request = self.request(a)?;
        let x = self.x;
        let Some((pending, mut send)) = open(x, a, request, self.body.is_empty()).await? else {
            // Only `auto` upstreams fall back, and HTTP/1.x clients do not take them to h2.
            return Err(ProxyError::UpstreamTls("the server chose HTTP/1.1").into());
        };
        self.go_on().await?;
        let (bounds, timeouts, mut client) = (self.bounds(), Timeouts::of(&x.target), self.client);
        let conn = &mut *self.conn;
        let (mut cr, mut cw) = conn.stream.split().map_err(ProxyError::client_io)?;
        let mut state = match self.body.is_empty() {
            true => Upload::Done,
            false => Upload::Running,
        };
        let (buf, consumed, body) = (&mut conn.buf, &self.consumed, &mut self.body);
        let whole = body.is_whole();
        let upload = body.upload(&mut cr, buf, &mut send, consumed, timeouts);
        tokio::pin!(upload);
        let mut interim = Http1Interim {
            writer: &mut cw,
            timeout: timeouts.client,
            informed: &mut self.informed,
        };
        // An HTTP/1.x client is not watched while it waits (it cannot cancel a request).
        let gone = std::future::pending();
        let head = final_head(
            pending,
            upload.as_mut(),
            &mut state,
            &mut interim,
            bounds,
            gone,
        );
        let (head, _lease) = head.await?;
        let (parts, mut up_body) = head.into_parts();
        let status = parts.status.as_u16();
        self.resp.status = status;
        if !tries.relays(status, whole || self.consumed.get() == 0, self.informed) {
            return Err(Miss::retried(status));
        }
        if let Some(reply) = conn.fill.as_deref().and_then(|f| answer_instead(f, &parts)) {
            tries.count(a, Ok(status));
            return Ok(Ended::Stored(reply));
        }
        let route = x.target.route;
        let mut edits = Edits::of(route, &conn.resp_lines, a.server, &conn.host);
        edits.cookie = tries.set_cookie();
        client.end_stream = up_body.is_end_stream();
        let head = client_head(&mut conn.out, route, &mut edits, &parts, &client);
        tries.count(a, head.as_ref().map(|_| status).map_err(|e| *e));
        let (framing, keep_alive, mut coding) = match head {
            Ok(head) => head,
            Err(e) => return Ok(Ended::Relayed(Err(e.into()))),
        };
        let mut recorder = admit(conn.fill.take(), &mut conn.out, &parts);
        let received = Cell::new(0);
        let mut source = H2Source::new(&mut up_body, timeouts.upstream, Peer::Upstream, &received);
        let mut sink = Http1Sink {
            writer: &mut cw,
            timeout: timeouts.client,
            sent: &mut conn.sent,
            head: &conn.out,
            chunked: framing == Framing::Chunked,
            trailers: client.te_trailers.then_some(relayed_in_trailers),
        };
        let recording = recorder.as_mut();
        let relayed = async {
            match framing {
                Framing::Empty => sink.end(Trailers::None).await.map_err(Broke::Sink),
                _ => relay_recorded(&mut source, &mut sink, coding.as_mut(), recording).await,
            }
        };
        let upload = (state == Upload::Running).then_some(upload);
        let relayed = relay_while_uploading(upload, relayed).await;
        conn.current.compressed = coding.as_ref().map(Coding::compressed);
        if let (Ok(_), Some(recorder)) = (&relayed, recorder) {
            recorder.finish();
        }
        Ok(Ended::Relayed(match relayed {
            Err(Broke::Source(e) | Broke::Sink(e)) => Err(Failure::after_head(e)),
            // A request body the client is still sending cannot be skipped: close.
            Ok(request_done) => Ok(keep_alive && request_done && state != Upload::Stopped),
        }))
    }

    fn replayable(&self) -> bool {
        self.body.is_whole() || self.consumed.get() == 0
    }

    fn responded(&self) -> bool {
        self.informed
    }
}

impl FromHttp1<'_, '_> {
    /// The client waits for 100 before sending its body (`expect`): Weir reads it at
    /// once, so it says so itself, once a server took the stream (an HTTP/2 server need
    /// not answer `expect`).
    async fn go_on(&mut self) -> Result<(), ProxyError> {
        if !self.expect || self.informed {
            return Ok(());
        }
        self.informed = true;
        let go_on = b"HTTP/1.1 100 Continue\r\n\r\n";
        let timeout = self.x.target.listener.client_timeout;
        body::write_all(&mut self.conn.stream, go_on, &[], timeout)
            .await
            .map_err(|_| ProxyError::ClientClosed)
    }

    /// The wait for the final head: `response_timeout` from the end of the upload; 1xx
    /// heads relayed but to HTTP/1.0 clients, at most the listener's `max_informational`.
    fn bounds(&self) -> HeadBounds {
        HeadBounds {
            timeout: self.x.target.upstream.response_timeout,
            deadline: None,
            max_informational: self.x.target.listener.max_informational,
            relay: !self.client.http10,
            tokens: true,
        }
    }

    /// The request for try `a`: the head written for its server, as HTTP/2 fields.
    fn request(&mut self, a: &Attempt<'_>) -> Result<http::Request<()>, Miss> {
        let (target, conn) = (&self.x.target, &mut *self.conn);
        let offered = write_heads(conn, self.req, &self.head, target, a.server);
        if !offered.is_empty() {
            let refused = ProxyError::NotImplemented("upgrade to an HTTP/2-only upstream");
            return Err(Miss::unsent(refused));
        }
        let request = h2_request(&conn.out, target, self.client.te_trailers);
        let mut request = request.map_err(Miss::unsent)?;
        if self.expect {
            request.headers_mut().remove(http::header::EXPECT);
        }
        Ok(request)
    }
}

/// Writes the client's head for an HTTP/2 upstream's `parts` into `out` with the route's
/// `edits` (the compression plan made here, from the coding the client accepts). Returns the
/// body's framing, whether the client connection stays open, and the compression; `Err`:
/// the compressor did not start, refused before any of the response went out.
fn client_head(
    out: &mut Vec<u8>,
    route: &weir_config::Route,
    edits: &mut Edits<'_>,
    parts: &http::response::Parts,
    client: &ForClient,
) -> Result<(Framing, bool, Option<Coding>), ProxyError> {
    let coding = plan_h2(route, parts, client, edits)?;
    out.clear();
    let (framing, keep_alive) = write_from_h2(out, parts, edits, client);
    Ok((framing, keep_alive, coding))
}

/// The entry a route cache's miss (`fill`) answers with instead of the response `parts`
/// (a `304` that refreshed it, a 5xx it answers for), if any.
fn answer_instead(fill: &Fill, parts: &http::response::Parts) -> Option<Box<Reply>> {
    fill.answer_instead(Http2(parts)).map(Box::new)
}

/// The recorder of the response `parts` if a route cache's miss (`fill`) may store it;
/// the miss's `Cache-Status` line goes into the client's head in `out`.
fn admit(
    fill: Option<Box<Fill>>,
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
) -> Option<Box<Recorder>> {
    let fill = fill?;
    if let Some(line) = fill.status_line() {
        push_before_end(out, line);
    }
    fill.admit(Http2(parts), false)
}

/// Whether an HTTP/2 upstream's trailer field goes into an HTTP/1.1 client's chunked
/// trailer section: not one a trailer must not carry, and a token (`h2` takes names with
/// `"`), as from an HTTP/1.1 upstream (`http2::trailers`).
fn relayed_in_trailers(name: &str) -> bool {
    !forbidden_in_trailer(name) && is_token(name.as_bytes())
}
