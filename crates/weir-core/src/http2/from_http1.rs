//! An HTTP/1.x client's request to an HTTP/2 upstream (`protocol = "h2"` / `"h2c"`): the
//! tries of an HTTP/2 client's stream (`http2::upstream`'s sender), with the client's
//! connection as the side the response goes to ([`Http1Client`]).
//!
//! Each try writes the HTTP/1.1 head every upstream gets, for its server, and sends it as
//! HTTP/2 fields (`upstream_request::h1_head_to_h2`); the body goes as DATA under the
//! upstream's flow control (`forward::h2::request_body`); the response head is written as
//! HTTP/1.1 (`forward::head::write_from_h2`) and its body relayed by the one relay.
//! Upgrades (WebSocket) cannot be carried to an HTTP/2-only upstream (`h2`, `h2c`:
//! `forward::tunnels_to`): they are refused with 501.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use h2::SendStream;

use super::exchange::StreamRequest;
use super::interim::Relayed as Informed;
use super::upstream::{Answer, ClientBody, ClientSide, H2Facts, Relayed};
use crate::buffer::Buffer;
use crate::client::{origin, ClientConn};
use crate::client_stream::{ClientReadHalf, ClientWriteHalf};
use crate::codec::http1::header::tokens;
use crate::codec::http1::write::push_header;
use crate::codec::http1::{HeaderKind, RequestHead, ResponseHead};
use crate::error::ProxyError;
use crate::files::{send_http1, Under};
use crate::forward::h1::{Http1Interim, Interim, RequestMeta};
use crate::forward::h2::request_body::RequestBody;
use crate::forward::h2::{relay_while_uploading, HeadBounds};
use crate::forward::head::{write_from_h2, ForClient, Framing};
use crate::forward::relay::{
    relay, Broke, Coding, Dropped, H2Upload, Http1Sink, Piece, Sink, Source, Trailers,
};
use crate::forward::request_head::HeadNames;
use crate::forward::{Failure, Target, Timeouts};
use crate::metrics::shard::Protocol;
use crate::request::Request;
use crate::request::Trace;
use crate::worker::Worker;
use weir_config::Listener;

/// Forwards the request whose head `req` is at the start of `conn.buf` to `target`'s
/// HTTP/2 upstream, as `forward::exchange::forward_h1` does to an HTTP/1.1 one. Returns
/// whether the client connection stays open.
pub(crate) async fn forward_h2(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    meta: RequestMeta,
    keep_alive: bool,
) -> Result<bool, Failure> {
    let buf = conn.buf.filled();
    let limit = target.listener.max_body_size;
    let mut body = RequestBody::new(req, limit, buf)?;
    let ask = ForClient {
        is_head: meta.is_head,
        http10: meta.http10,
        te_trailers: te_trailers(buf, req),
        accepted: meta.accepted,
        end_stream: false,
        keep_alive,
    };
    let mut trace = std::mem::take(&mut conn.current.exchange);
    let tried = tries(worker, target, conn, req, &mut body, ask, &mut trace).await;
    if trace.status != 0 {
        resp.status = trace.status;
    }
    conn.current.exchange = trace;
    // The request is consumed once answered (a streamed body consumed it as it went).
    conn.buf.consume(body.skip);
    conn.current.read = body.is_read();
    match tried? {
        (Relayed::Over(relayed), kept) => relayed.map(|()| kept),
        (Relayed::Stored(reply), _) => {
            let under = Under::of_target(&target);
            let keep_alive = ask.keep_alive && conn.current.read;
            send_http1(conn, under, *reply, meta, keep_alive, resp).await
        }
        // Only `auto` upstreams fall back, and HTTP/1.x clients do not take them to h2.
        (Relayed::Http1, _) => Err(ProxyError::UpstreamTls("the server chose HTTP/1.1").into()),
    }
}

/// The tries of the request `req` (its `body`) on `conn` (`http2::upstream`'s sender),
/// the response relayed as `ask` says. Returns how the try that answered ended and
/// whether the connection stays open after it; a cache miss's fill, if unused, goes back
/// to `conn.fill` (its stale entry may answer for a failure).
async fn tries(
    worker: &Worker,
    target: Target<'_>,
    conn: &mut ClientConn,
    req: &RequestHead,
    body: &mut RequestBody,
    ask: ForClient,
    trace: &mut Trace,
) -> Result<(Relayed, bool), Failure> {
    // A streamed upload consumes the head from the buffer: the tries write their requests
    // from this copy (one per streamed upload, none for a body at hand).
    let copy = match body.whole {
        Some(_) => Vec::new(),
        None => conn.buf.filled()[..req.head_len].to_vec(),
    };
    let fill = Cell::new(conn.fill.take());
    let ClientConn {
        stream,
        buf,
        out,
        sent,
        path,
        ip,
        peer_ip,
        tls,
        current,
        trace: span,
        resp_lines,
        ..
    } = &mut *conn;
    let (mut reader, writer) = stream.split().map_err(ProxyError::client_io)?;
    let expect = req.expect_continue && body.whole.is_none();
    let trailers = body.trailers.clone();
    let (head, up_body) = match body.whole.clone() {
        _ if body.is_empty() => (buf.filled(), None),
        Some(whole) => (buf.filled(), Some(Http1Body::Whole(whole, trailers))),
        None => {
            let reader = &mut reader;
            (&copy[..], Some(Http1Body::Streamed { body, reader, buf }))
        }
    };
    let mut client = Http1Client {
        writer,
        sent,
        listener: target.listener,
        client: ask,
        expect,
        informed: false,
        keep_alive: false,
    };
    let r = StreamRequest {
        worker,
        target,
        request: Request {
            buf: head,
            req,
            origin: origin(ip, *peer_ip, current, tls.as_deref()),
            started: current.started,
            protocol: Protocol::Http1,
            trace: span.as_deref(),
        },
        path,
        relayed: Informed::default(),
        spare: &Cell::new(http::HeaderMap::new()),
        fill,
        response_lines: Cell::new(std::mem::take(resp_lines)),
    };
    let facts = H2Facts {
        te_trailers: ask.te_trailers,
        ..H2Facts::default()
    };
    let tried = r.drive_h2(&facts, None, up_body, &mut client, out, trace);
    let (relayed, _) = tried.await;
    *resp_lines = r.response_lines.take();
    let fill = r.fill.take();
    let kept = client.keep_alive;
    conn.fill = fill;
    Ok((relayed?, kept))
}

/// Whether the client sent `TE` with the `trailers` token.
fn te_trailers(buf: &[u8], req: &RequestHead) -> bool {
    let mut te = req.headers.iter().filter(|h| h.kind == HeaderKind::Te);
    te.any(|h| tokens(&buf[h.value.clone()]).any(|t| t.eq_ignore_ascii_case(b"trailers")))
}

/// An HTTP/1.x client's request body: whole at hand with its trailer lines, if any (sent
/// again as it is on another try), or streamed from the client's socket and buffer.
enum Http1Body<'b, 'c> {
    Whole(Bytes, Option<Bytes>),
    Streamed {
        body: &'b mut RequestBody,
        reader: &'b mut ClientReadHalf<'c>,
        buf: &'b mut Buffer,
    },
}

impl ClientBody for Http1Body<'_, '_> {
    async fn upload(
        &mut self,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        _limit: Option<u64>,
        timeouts: Timeouts,
        names: HeadNames<'_>,
    ) -> Result<(), Broke> {
        match self {
            Http1Body::Whole(whole, trailers) => {
                consumed.set(whole.len() as u64);
                let mut sink = H2Upload {
                    send: up,
                    timeout: timeouts.upstream,
                    first: false,
                    names,
                };
                let sent = async {
                    let last = trailers.is_none();
                    sink.data(Piece::Bytes(whole.clone()), last).await?;
                    match trailers {
                        Some(lines) => sink.end(Trailers::Lines(lines)).await,
                        None => Ok(()),
                    }
                };
                sent.await.map_err(Broke::Sink)
            }
            // Held to `max_body_size` as it is decoded (`RequestBody`).
            Http1Body::Streamed { body, reader, buf } => {
                body.stream(*reader, buf, up, consumed, timeouts, names)
                    .await
            }
        }
    }

    fn is_whole(&self) -> bool {
        matches!(self, Http1Body::Whole(..))
    }
}

/// An HTTP/1.x client's connection while an HTTP/2 upstream answers its request.
struct Http1Client<'c> {
    writer: ClientWriteHalf<'c>,
    /// Bytes written to the client (the connection's count).
    sent: &'c mut u64,
    /// Its `client_timeout` and `max_informational`.
    listener: &'c Listener,
    /// What the client asked that shapes the response (`end_stream` is each try's).
    client: ForClient,
    /// The client waits for 100 before sending its body: Weir reads it at once, so it
    /// says so itself (the field is not sent on).
    expect: bool,
    /// The client has a 1xx head (Weir's 100 Continue, or one relayed).
    informed: bool,
    /// The connection stays open after the relayed response.
    keep_alive: bool,
}

impl ClientSide for Http1Client<'_> {
    fn waiting(&mut self) -> (impl Interim + '_, impl Future<Output = ProxyError> + '_) {
        let interim = Http1Interim::new(&mut self.writer, self.listener, &mut self.informed);
        // An HTTP/1.x client is not watched while it waits (it cannot cancel a request).
        (interim, std::future::pending())
    }

    fn for_client(&self, _: &StreamRequest<'_>, end_stream: bool) -> ForClient {
        ForClient {
            end_stream,
            ..self.client
        }
    }

    /// The listener's `max_informational`; 1xx heads relayed but to HTTP/1.0 clients;
    /// field names that go into an HTTP/1.1 head must be tokens (the `h2` crate takes
    /// names with `"`, RFC 9110 5.1).
    fn bounds(&self, stream: HeadBounds) -> HeadBounds {
        HeadBounds {
            max_informational: self.listener.max_informational,
            relay: !self.client.http10,
            tokens: true,
            ..stream
        }
    }

    fn edit_request(&self, request: &mut http::Request<()>) {
        if self.expect {
            request.headers_mut().remove(http::header::EXPECT);
        }
    }

    /// Says `100 Continue` to a client that waits for it, once a server took the stream
    /// (an HTTP/2 server need not answer `expect`).
    async fn opened(&mut self) -> Result<(), ProxyError> {
        // An HTTP/1.0 client's Expect is not answered: it is sent no 1xx (RFC 9110 15.2).
        if !self.expect || self.informed || self.client.http10 {
            return Ok(());
        }
        let mut interim = Http1Interim::new(&mut self.writer, self.listener, &mut self.informed);
        interim.tell().await.map(|_| ())
    }

    fn responded(&self) -> bool {
        self.informed
    }

    async fn respond<S: Source, U: Future<Output = Result<(), Broke>>>(
        &mut self,
        answer: Answer<'_>,
        source: &mut S,
        upload: Option<Pin<&mut U>>,
        coding: Option<&mut Coding>,
        _: &mut Trace,
    ) -> Result<(), Failure> {
        let out = answer.out;
        out.clear();
        let (framing, keep_alive) = write_from_h2(out, &answer.parts, answer.edits, &answer.client);
        if let Some(status) = answer.cache_status {
            // Before the blank line that ends the head.
            out.truncate(out.len() - 2);
            push_header(out, b"Cache-Status", status.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let edits = answer.edits;
        let dropped = |name: &[u8]| edits.drops(name);
        let mut sink = Http1Sink {
            writer: &mut self.writer,
            timeout: self.listener.client_timeout,
            sent: &mut *self.sent,
            head: out,
            chunked: framing == Framing::Chunked,
            // Less what no trailer may carry (`forward::trailer`) and what the route took
            // out of the head, as for any client.
            trailers: answer.client.te_trailers.then_some(&dropped as Dropped<'_>),
        };
        let relayed = async {
            match framing {
                Framing::Empty => sink.end(Trailers::None).await.map_err(Broke::Sink),
                _ => relay(source, &mut sink, coding).await,
            }
        };
        match relay_while_uploading(upload, relayed).await {
            Err(Broke::Source(e) | Broke::Sink(e)) => Err(Failure::after_head(e)),
            // A request body the client is still sending cannot be skipped: close.
            Ok(request_done) => {
                self.keep_alive = keep_alive && request_done && !answer.upload_stopped;
                Ok(())
            }
        }
    }
}
