//! The response an HTTP/2 or HTTP/3 client's stream gets from an upstream of either protocol: the
//! head built with the route's edits (`forward::head::Edits`: hop-by-hop fields dropped,
//! locations mapped back, `response_headers`, the compression plan, the sticky cookie),
//! then the body through the one relay (`forward::relay`) into the stream
//! (`send::StreamSink`), compressed when the plan says so, its trailers after it.

use bytes::Bytes;
use h2::{Reason, SendStream};
use http::{HeaderMap, HeaderValue};

use super::names::response_name;
use super::outbox;
pub(crate) use super::send::Sinking;
use super::send::{send_bytes, window, Stop, StreamSink};
use crate::codec::http1::ResponseHead;
use crate::codec::Fields;
use crate::error::ProxyError;
use crate::files::{BodySource, PIECE};
use crate::forward::head::Edits;
use crate::forward::relay::{relay, Broke, Coding, Piece, Sink, Source};
use crate::forward::trailer;
use crate::forward::Failure;
use crate::request::Trace;

/// The h2 head for an HTTP/1.1 upstream's `resp`, whose bytes are `buf` (one copy of what
/// arrived: the values are slices of it): hop-by-hop and `Connection`-listed fields
/// dropped, names lower-cased, `edits` applied. `headers`: an empty field map to fill
/// (the request's, its allocations kept).
pub(crate) fn head_from_http1(
    resp: &ResponseHead,
    buf: &Bytes,
    edits: &Edits<'_>,
    mut headers: HeaderMap,
) -> http::Response<()> {
    let mut mapped = Vec::new();
    for h in &resp.headers {
        let name = &buf[h.name.clone()];
        if h.connection_listed || h.kind.is_hop_by_hop() || edits.drops(name) {
            continue;
        }
        mapped.clear();
        let value = match edits.map_location(h.kind, &buf[h.value.clone()], &mut mapped) {
            true => HeaderValue::from_bytes(&mapped),
            false => HeaderValue::from_maybe_shared(buf.slice(h.value.clone())),
        };
        if let (Ok(name), Ok(value)) = (response_name(name), value) {
            headers.append(name, value);
        }
    }
    let fields = Fields::Http1 {
        buf,
        headers: &resp.headers,
    };
    append_lines(&mut headers, edits, fields, &mut mapped);
    let mut response = http::Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(resp.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    *response.headers_mut() = headers;
    response
}

/// The HTTP/1.1 head `resp` (its bytes: `buf`) as a client stream's head (HTTP/2 or
/// HTTP/3), for an upstream's 1xx head or Weir's own answers: [`head_from_http1`] with no
/// edits (its end-to-end fields, names lower-cased; a field that is no valid HTTP/2 one
/// dropped), from one copy of the head that its values slice.
pub(crate) fn end_to_end_head(buf: &[u8], resp: &ResponseHead) -> http::Response<()> {
    let head = Bytes::copy_from_slice(&buf[..resp.head_len]);
    head_from_http1(resp, &head, &Edits::default(), HeaderMap::new())
}

/// An HTTP/2 upstream's head `parts` with `edits` applied in place (a route without edits
/// leaves the map as it came).
pub(super) fn head_from_h2(parts: http::response::Parts, edits: &Edits<'_>) -> http::Response<()> {
    let mut response = http::Response::from_parts(parts, ());
    if edits.keeps_fields() && edits.cookie.is_none() && edits.plan == Default::default() {
        return response;
    }
    let headers = response.headers_mut();
    let mut kept = HeaderMap::with_capacity(headers.len());
    let mut scratch = Vec::new();
    for (name, value) in headers.iter() {
        if edits.drops(name.as_str().as_bytes()) {
            continue;
        }
        let kind = crate::codec::http1::HeaderKind::of(name.as_str().as_bytes());
        scratch.clear();
        let value = match edits.map_location(kind, value.as_bytes(), &mut scratch) {
            true => HeaderValue::from_bytes(&scratch).unwrap_or_else(|_| value.clone()),
            false => value.clone(),
        };
        kept.append(name.clone(), value);
    }
    append_lines(&mut kept, edits, Fields::Http2(headers), &mut scratch);
    *headers = kept;
    response
}

/// Appends the lines `edits` add (`Name: value` each, as `forward::head` writes them) as
/// fields. Names and values were checked where they were made (config, a parsed head), so
/// a conversion cannot fail in practice; a line that would is skipped.
fn append_lines(
    headers: &mut HeaderMap,
    edits: &Edits<'_>,
    fields: Fields<'_>,
    scratch: &mut Vec<u8>,
) {
    scratch.clear();
    edits.push_lines(scratch, fields);
    for (_, name, value) in trailer::fields(scratch).flatten() {
        if let (Ok(name), Ok(value)) = (response_name(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
}

/// A client's stream that takes a response from an HTTP/1.1 upstream or from a source of
/// Weir's own (a static file, a cache entry): an HTTP/2 client's (`SendResponse`) or an
/// HTTP/3 client's (`http3::body`).
pub(crate) trait ResponseStream {
    /// Sends `head` (the stream ends with it when there is no `source`), then relays
    /// `source`'s body and trailers into the stream as `sinking` says, compressed through
    /// `coding` when there is one, or sends `whole` (the body, all at hand: no rounds) as
    /// its one last DATA. A failure once the head went out resets the stream.
    fn send_relayed<S: Source>(
        &mut self,
        head: http::Response<()>,
        source: Option<&mut S>,
        sinking: Sinking<'_>,
        coding: Option<&mut Coding>,
        whole: Option<Bytes>,
    ) -> impl std::future::Future<Output = Result<(), Failure>>;

    /// As [`ResponseStream::send_relayed`], uncompressed, for a body Weir reads itself
    /// (a static file's, a cache entry's): an HTTP/2 stream reads each piece only once
    /// its client's window has room for it; an HTTP/3 stream relays
    /// it as any body.
    fn send_read(
        &mut self,
        head: http::Response<()>,
        source: Option<&mut BodySource<'_>>,
        sinking: Sinking<'_>,
    ) -> impl std::future::Future<Output = Result<(), Failure>> {
        self.send_relayed(head, source, sinking, None, None)
    }

    /// Sends `head` and its `body`, all at hand (none: the head ends the stream), each
    /// write waiting at most `stall`: Weir's own answers. Notes in `trace` the
    /// `grpc_status` once the head is sent and the body's length once it is, as far as
    /// it got.
    fn send_whole(
        &mut self,
        head: http::Response<()>,
        body: &[u8],
        stall: std::time::Duration,
        trace: &mut Trace,
        grpc_status: Option<u32>,
    ) -> impl std::future::Future<Output = Result<(), ProxyError>>;

    /// Ends the stream with no response: the client left.
    fn cancel(&mut self);

    /// Resets the stream after a failure once its head went out (the response is cut
    /// short; a stream left as it is could look complete).
    fn cut(&mut self) {
        self.cancel();
    }
}

/// Sends `head` on `respond` (ending the stream when `end`) and notes the `grpc-status`
/// it carries; the stream's body half.
fn send_head(
    respond: &mut h2::server::SendResponse<Bytes>,
    head: http::Response<()>,
    end: bool,
    sinking: &mut Sinking<'_>,
) -> Result<SendStream<Bytes>, Failure> {
    let send = respond
        .send_response(head, end)
        .map_err(|_| Failure::after_head(ProxyError::ClientClosed))?;
    sinking.trace.sent_grpc_status(sinking.grpc_status);
    Ok(send)
}

impl ResponseStream for h2::server::SendResponse<Bytes> {
    async fn send_relayed<S: Source>(
        &mut self,
        head: http::Response<()>,
        source: Option<&mut S>,
        mut sinking: Sinking<'_>,
        coding: Option<&mut Coding>,
        whole: Option<Bytes>,
    ) -> Result<(), Failure> {
        let mut send = send_head(self, head, source.is_none(), &mut sinking)?;
        let Some(source) = source else { return Ok(()) };
        let mut sink = StreamSink {
            send: &mut send,
            sinking,
        };
        let relayed = match whole {
            Some(whole) => sink
                .data(Piece::Bytes(whole), true)
                .await
                .map_err(Broke::Sink),
            None => relay(source, &mut sink, coding).await,
        };
        let error = match relayed {
            Ok(()) => return Ok(()),
            Err(Broke::Source(e) | Broke::Sink(e)) => e,
        };
        // A failure once the head went out: the stream is reset (CANCEL).
        send.send_reset(Reason::CANCEL);
        Err(Failure::after_head(error))
    }

    /// Each piece is read only once the stream has window for it, and no more than that
    /// ([`PIECE`] at most): a client that opens many streams and gives them no window
    /// makes Weir read (and hold) none of their files, where a piece read first held up
    /// to [`PIECE`] per stream while it waited (attacker review: 10 connections of 100
    /// such streams, 128 MB). A new stream's window is there as soon as its head is (the
    /// client opened it), so this costs no wait. On a failure the stream is reset.
    async fn send_read(
        &mut self,
        head: http::Response<()>,
        source: Option<&mut BodySource<'_>>,
        mut sinking: Sinking<'_>,
    ) -> Result<(), Failure> {
        let mut send = send_head(self, head, source.is_none(), &mut sinking)?;
        let Some(source) = source else { return Ok(()) };
        let (stall, trace) = (sinking.stall, sinking.trace);
        let closed = |_| Stop::Error(ProxyError::ClientClosed);
        // Window granted and not yet used: the connection's `max_connection_send_buffer` may
        // cut a piece shorter than the window, and so does a multipart body's boundary text;
        // the `h2` crate reports only increases of it, so a wait with some left never ends.
        let mut credit = 0;
        let sent: Result<(), Stop> = async {
            loop {
                let want = source.remaining().clamp(1, PIECE) as usize;
                if credit == 0 {
                    credit = window(&mut send, want, stall).await?;
                }
                let room = outbox::within(&mut send, credit.min(want), stall).await?;
                source.bound(room as u64);
                let Some((piece, last)) = source.next().await? else {
                    return send.send_data(Bytes::new(), true).map_err(closed);
                };
                let data = piece.into_bytes();
                let len = data.len() as u64;
                send.send_data(data, last).map_err(closed)?;
                outbox::handed(len as usize);
                credit = credit.saturating_sub(len as usize);
                trace.body_out += len;
                source.taken();
                if last {
                    return Ok(());
                }
            }
        }
        .await;
        let Err(stop) = sent else {
            return Ok(());
        };
        send.send_reset(Reason::CANCEL);
        Err(Failure::after_head(stop.noted(trace)))
    }

    async fn send_whole(
        &mut self,
        head: http::Response<()>,
        body: &[u8],
        stall: std::time::Duration,
        trace: &mut Trace,
        grpc_status: Option<u32>,
    ) -> Result<(), ProxyError> {
        let mut send = self
            .send_response(head, body.is_empty())
            .map_err(|_| ProxyError::ClientClosed)?;
        trace.sent_grpc_status(grpc_status);
        if !body.is_empty() {
            let sent = send_bytes(&mut send, Bytes::copy_from_slice(body), true, stall);
            sent.await.map_err(|_| ProxyError::ClientClosed)?;
            trace.body_out = body.len() as u64;
        }
        Ok(())
    }

    fn cancel(&mut self) {
        self.send_reset(Reason::CANCEL);
    }
}
