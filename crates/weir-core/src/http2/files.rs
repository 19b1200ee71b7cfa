//! A reply (`files::Reply`: a static file's, or a cache entry's) on an HTTP/2 or HTTP/3
//! client's stream, sent as an HTTP/1.1 upstream's response is (`exchange::respond_http1`):
//! the head through the route's `Edits` (`respond::head_from_http1`), the body through the one relay into the
//! stream (`respond::ResponseStream`), compressed when the route's plan says so. An
//! uncompressed body on an HTTP/2 stream is read a piece at a time within the stream's
//! window (`ResponseStream::send_read`), not read first and then held until the window opens.

use bytes::Bytes;

use super::respond::{head_from_http1, ResponseStream, Sinking};
use crate::codec::http1::{parse_response, BodyFraming, ResponseHead};
use crate::error::ProxyError;
use crate::files::{BodySource, Reply, Under};
use crate::filters::compression;
use crate::forward::head::{coding, Edits};
use crate::forward::request_head::render_response_rules;
use crate::forward::Failure;
use crate::request::Request;
use crate::request::Trace;
use crate::router::RoutedPath;

/// Sends `reply` to the request `r` on `respond`; notes its status and body in `trace`.
pub(crate) async fn respond_stream<R: ResponseStream>(
    respond: &mut R,
    r: &Request<'_>,
    path: &RoutedPath,
    under: Under<'_>,
    mut reply: Reply,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let Under { route, listener } = under;
    let is_head = r.req.is_head;
    let mut resp = ResponseHead::default();
    let head = Bytes::from(std::mem::take(&mut reply.head));
    // Weir wrote this head itself: it always parses.
    if !parse_response(&head, head.len(), is_head, &mut resp)? {
        return Err(ProxyError::UpstreamMalformed("incomplete file reply head").into());
    }
    let accepted = route
        .filters
        .compression
        .as_ref()
        .and_then(|c| compression::negotiate(c, r.buf, &r.req.headers));
    let mut lines = Vec::new();
    render_response_rules(&mut lines, r, path, route);
    let rules = route.filters.response_headers.as_ref();
    let edits = Edits {
        rules: rules.map(|rules| (rules, &lines[..])),
        plan: reply.plan(route, &head, &resp, is_head, accepted),
        ..Edits::default()
    };
    let response = head_from_http1(&resp, &head, &edits, http::HeaderMap::new());
    let mut coding = coding(route, &edits.plan, resp.framing.length())?;
    let empty = matches!(resp.framing, BodyFraming::None | BodyFraming::Length(0));
    trace.status = resp.status;
    trace.local = true;
    if reply.cache.is_some() {
        trace.cache = reply.cache;
    }
    let sink = Sinking::of(&listener.http2, &edits, trace);
    let mut source = BodySource::new(&reply.body);
    let source = (!empty).then_some(&mut source);
    let relayed = match coding.as_mut() {
        None => respond.send_read(response, source, sink).await,
        Some(coding) => {
            let relayed = respond.send_relayed(response, source, sink, Some(coding), None);
            relayed.await
        }
    };
    trace.compressed = coding.as_ref().map(|c| c.counts);
    relayed
}
