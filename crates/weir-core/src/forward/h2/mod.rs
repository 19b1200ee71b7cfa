//! The upstream side over an HTTP/2 stream (`protocol = "h2"`, `"h2c"`, `"auto"`), for
//! every client protocol: a stream on the worker's multiplexed `connector::h2` pool
//! ([`open`]), the final head awaited while the request body goes up, 1xx heads relayed
//! ([`final_head`]), and the response relayed while the rest of the body goes up
//! ([`relay_while_uploading`]: gRPC streams both ways at once).
//!
//! The request is the HTTP/1.1 head every upstream gets (`forward::request_head`) as
//! HTTP/2 fields (`http2::upstream_request::h1_head_to_h2`: connection-specific fields
//! dropped, `Host` to `:authority`, `te: trailers` kept when the client sent it); an HTTP/2
//! or HTTP/3 client's first try is made from its own fields instead (`upstream_request`). A
//! stream the server never processed (REFUSED_STREAM, above a GOAWAY's last stream id, or a
//! connection that stopped taking streams) is [`Miss::unprocessed`]: the driver sends it
//! again (not on a connection going away) when its body can be sent again.

pub(crate) mod request_body;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::header::HeaderName;

use super::driver::{Attempt, Exchange, Miss};
pub(crate) use super::h1::Upload;
use super::h1::{upload_while_waiting, Interim, TOO_MANY_INFORMATIONAL};
use super::head::{coding, plan, Edits, ForClient};
use super::relay::{Broke, Coding};
use super::Reached;
use crate::codec::http1::header::is_token;
use crate::connector::h2::{checkout, h2_error, never_processed, Checkout, Lease};
use crate::error::ProxyError;

/// A stream sent to a server: its connection's lease and the response to come.
pub(crate) struct Pending {
    pub lease: Lease,
    pub response: ResponseFuture,
}

/// A stream for `request` to try `a`'s server (ended at once when `end`), on a pooled
/// connection with room, else a new one; with the request body's sending half. `None`:
/// an `auto` upstream whose server chose HTTP/1.1 (ALPN).
pub(crate) async fn open(
    x: &Exchange<'_>,
    a: &Attempt<'_>,
    request: http::Request<()>,
    end: bool,
) -> Result<Option<(Pending, SendStream<Bytes>)>, Miss> {
    let (pool, upstream) = (&x.worker.h2_pool, x.target.upstream);
    let tls = x.target.pool.tls.as_deref();
    let lease = match checkout(pool, upstream, a.server, tls, a.started).await? {
        Checkout::Lease(lease) => lease,
        Checkout::Http1 => return Ok(None),
    };
    match lease.send_request(request, end).await {
        Ok((response, send)) => Ok(Some((Pending { lease, response }, send))),
        // The connection takes no new streams (GOAWAY, closed): another one.
        Err(e) => Err(Miss {
            unprocessed: true,
            ..Miss::from(h2_error(&e))
        }),
    }
}

/// How long the final head may take, and how many 1xx heads may come before it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadBounds {
    /// From the end of the upload.
    pub timeout: Duration,
    /// From the start of the wait, upload or not: a gRPC client's `grpc-timeout`, the
    /// call's deadline.
    pub deadline: Option<Duration>,
    pub max_informational: u32,
    /// 1xx heads go to the client (not to an HTTP/1.0 client).
    pub relay: bool,
    /// The heads go into HTTP/1.1 ones: their field names must be tokens (the `h2` crate
    /// takes names with `"`, which are not, RFC 9110 5.1; a malformed response must not
    /// be forwarded, RFC 9113 8.1.1).
    pub tokens: bool,
}

/// Waits for the final head of `pending` while `upload` runs (`state` says where it is),
/// its 1xx heads relayed to `interim` (more than `bounds.max_informational` of them fail
/// it), unless the client goes away first (`gone`, with the error to fail with). A stream
/// the server never processed is [`Miss::unprocessed`] (its connection marked going away
/// on a GOAWAY).
pub(crate) async fn final_head<U, I, G>(
    pending: Pending,
    upload: Pin<&mut U>,
    state: &mut Upload,
    interim: &mut I,
    bounds: HeadBounds,
    gone: G,
) -> Result<(http::Response<RecvStream>, Lease), Miss>
where
    U: Future<Output = Result<(), Broke>>,
    I: Interim,
    G: Future<Output = ProxyError>,
{
    let Pending {
        lease,
        mut response,
    } = pending;
    let mut relayed = false;
    let head = async {
        let mut informational = 0u32;
        loop {
            let next = poll_fn(|cx| {
                if let Poll::Ready(Some(r)) = response.poll_informational(cx) {
                    return Poll::Ready(r.map(Err));
                }
                Pin::new(&mut response).poll(cx).map(|r| r.map(Ok))
            });
            let head = match next.await {
                Err(e) if never_processed(&e) && !relayed => {
                    if e.is_go_away() {
                        lease.drain();
                    }
                    return Err(Miss {
                        unprocessed: true,
                        ..Miss::from(ProxyError::UpstreamClosed)
                    });
                }
                Err(e) => return Err(h2_error(&e).into()),
                Ok(Ok(mut head)) if !bounds.tokens || names_are_tokens(head.headers()) => {
                    if head.status() == http::StatusCode::NO_CONTENT {
                        // No body, whatever it says (RFC 9110 8.6; see `parse_response`).
                        head.headers_mut().remove(http::header::CONTENT_LENGTH);
                    }
                    return Ok(head);
                }
                Ok(Err(head)) if head.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    return Err(SWITCHING_IN_HTTP2.into());
                }
                Ok(Err(head)) if !bounds.tokens || names_are_tokens(head.headers()) => head,
                Ok(_) => return Err(NAME_NOT_TOKEN.into()),
            };
            informational = informational.saturating_add(1);
            if informational > bounds.max_informational {
                return Err(TOO_MANY_INFORMATIONAL.into());
            }
            if bounds.relay {
                relayed |= interim.relay_h2(head).await?;
            }
        }
    };
    let (timeout, deadline) = (Some(bounds.timeout), bounds.deadline);
    match upload_while_waiting(upload, state, head, timeout, deadline, gone).await {
        Ok(head) => Ok((head, lease)),
        Err(mut miss) => {
            miss.failure.reached = Reached::before_head(relayed);
            Err(miss)
        }
    }
}

/// A `101` is malformed in HTTP/2 (RFC 9113 8.6): relayed to an HTTP/1.1 client it would
/// announce a tunnel that is not there, and a front proxy could take the response after
/// it for tunnelled bytes.
const SWITCHING_IN_HTTP2: ProxyError = ProxyError::UpstreamMalformed("101 over HTTP/2");

/// A field name that is not a token, for an HTTP/1.1 client (the server's error: 502).
const NAME_NOT_TOKEN: ProxyError = ProxyError::UpstreamMalformed("field name is not a token");

/// Whether every field name may go into an HTTP/1.1 head.
pub(crate) fn names_are_tokens(fields: &http::HeaderMap) -> bool {
    fields.keys().all(|name| is_token(name.as_str().as_bytes()))
}

/// Runs `relay` while the rest of the request body (`upload`, unless it is over) goes up.
/// Returns whether the whole body went up.
pub(crate) async fn relay_while_uploading<U, R, E>(
    upload: Option<Pin<&mut U>>,
    relay: R,
) -> Result<bool, E>
where
    U: Future<Output = Result<(), Broke>>,
    R: Future<Output = Result<(), E>>,
    E: From<ProxyError>,
{
    let Some(upload) = upload else {
        return relay.await.map(|()| true);
    };
    // Once the server takes no more (it may have answered already), the relay goes on.
    let mut state = Upload::Running;
    let gone = std::future::pending();
    let relayed = upload_while_waiting(upload, &mut state, relay, None, None, gone).await;
    relayed.map(|()| state == Upload::Done)
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

/// The server's `content-length`, if it sent one.
pub(crate) fn content_length(parts: &http::response::Parts) -> Option<u64> {
    let value = parts.headers.get(http::header::CONTENT_LENGTH)?;
    value.to_str().ok()?.parse().ok()
}

/// Plans the route's compression of an HTTP/2 upstream's response `parts` to `client`
/// (into `edits.plan`), for a client of any protocol. Returns the compression; `Err`: the
/// compressor did not start, refused before any of the response went out.
pub(crate) fn plan_h2(
    route: &weir_config::Route,
    parts: &http::response::Parts,
    client: &ForClient,
    edits: &mut Edits<'_>,
) -> Result<Option<Coding>, ProxyError> {
    use crate::codec::http1::BodyFraming;
    let length = content_length(parts);
    let framing = match (length, client.end_stream) {
        (Some(n), _) => BodyFraming::Length(n),
        (None, true) => BodyFraming::None,
        (None, false) => BodyFraming::Chunked,
    };
    let response = crate::filters::compression::Response {
        status: parts.status.as_u16(),
        fields: crate::codec::Fields::Http2(&parts.headers),
        framing,
        is_head: client.is_head,
        accepted: client.accepted,
        rules: route.filters.response_headers.as_ref(),
    };
    edits.plan = plan(route, &response);
    coding(route, &edits.plan, length)
}
