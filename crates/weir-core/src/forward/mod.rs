//! Forwarding one request to an upstream server and its response back to the client.
//!
//! The exchange (`proxy::forward` dispatches an HTTP/1.x client's request; `http2/` and
//! `http3/` their streams'): the driver (`driver`) picks a server and tries it through
//! the upstream side `carrier` says (`h1`: an HTTP/1.1 connection, `h2`: an HTTP/2
//! stream), writing the request head (and whatever body is already buffered), streaming the
//! rest of the body while waiting for the response head, relaying 1xx; then the response
//! head is written and its body streamed back. It decides whether each side's connection
//! can be kept; the retry rules (a try the server did not process again on that server,
//! another server as `retry.on` allows) are the driver's.

pub mod body;
pub(crate) mod driver;
pub(crate) mod exchange;
pub(crate) mod filling;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod head;
pub(crate) mod relay;
pub mod request_head;
pub(crate) mod trailer;
pub(crate) mod tunnel;

use weir_config::{Listener, Route, Upstream};

use crate::metrics::shard::Protocol;
use crate::upstream::UpstreamPlan;

/// What carries a request to its upstream: an HTTP/1.1 connection, or an HTTP/2 stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    Http1,
    Http2,
}

/// Which upstream side carries a request of a client speaking `client` to `upstream`,
/// decided here for every cell:
///
/// | upstream `protocol` | HTTP/1.x client | HTTP/2 client |
/// |---|---|---|
/// | `"http1"` | HTTP/1.1 connection | HTTP/1.1 connection |
/// | `"h2"`, `"h2c"` | HTTP/2 stream | HTTP/2 stream |
/// | `"auto"` over TLS | HTTP/1.1 connection (ALPN `http/1.1`) | HTTP/2 stream, or an HTTP/1.1 connection when the server's ALPN chose `http/1.1` |
/// | `"auto"` cleartext | HTTP/1.1 connection | HTTP/1.1 connection |
///
/// An upgrade (an HTTP/1.1 `Upgrade`, an RFC 8441 extended CONNECT) takes an HTTP/1.1
/// connection where [`tunnels_to`] allows, and is refused with 501 elsewhere. An HTTP/3
/// client's request takes an HTTP/1.1 connection for `"http1"` and `"auto"`, and an HTTP/2
/// stream for `"h2"`, `"h2c"` (`http3::upstream`).
pub(crate) fn carrier(client: Protocol, upstream: &Upstream) -> Carrier {
    use weir_config::UpstreamProtocol::*;
    match (upstream.protocol, client) {
        (H2 | H2c, _) => Carrier::Http2,
        (Auto, Protocol::Http2) if upstream.tls.is_some() => Carrier::Http2,
        (Http1 | Auto, _) => Carrier::Http1,
    }
}

/// Whether an upgrade (a WebSocket: an HTTP/1.1 `Upgrade`, or an HTTP/2 client's extended
/// CONNECT) can reach `upstream`. It is carried as an HTTP/1.1 Upgrade on a connection of
/// its own, made with ALPN `http/1.1` over TLS, so only upstreams whose servers speak
/// HTTP/1.1 take it: `http1`, and `auto` (whose HTTP/1.x clients' requests go over
/// HTTP/1.1 already). An `h2` or `h2c` upstream is declared HTTP/2-only: an upgrade there
/// gets 501 without reaching a server. Trying HTTP/1.1 on such a server anyway would let
/// anyone eject the pool's servers: its refusal (an ALPN alert, a closed connection, or
/// HTTP/2 frames) would count as the server's failure.
pub(crate) fn tunnels_to(upstream: &Upstream) -> bool {
    use weir_config::UpstreamProtocol::*;
    matches!(upstream.protocol, Http1 | Auto)
}

/// How long a body's relay waits on each side: for the client (its next bytes, or room
/// for Weir's), and for the upstream.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub client: std::time::Duration,
    pub upstream: std::time::Duration,
    /// The listener's `min_body_rate`, for a client's request body.
    pub min_body_rate: Option<weir_config::MinBodyRate>,
}

impl Timeouts {
    /// `target`'s: its listener's `client_timeout`, its upstream's `response_timeout`.
    pub fn of(target: &Target<'_>) -> Timeouts {
        Timeouts {
            client: target.listener.client_timeout,
            upstream: target.upstream.response_timeout,
            min_body_rate: target.listener.min_body_rate,
        }
    }
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

use crate::error::ProxyError;

/// How far the response to the client got when a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// Nothing was sent: Weir answers with the error's status.
    Nothing,
    /// Only 1xx responses were sent. A final response may still follow them, so Weir still
    /// answers; but the request is not replayed on another server.
    Interim,
    /// The final response head was sent (or its write began): the response is cut short,
    /// the connection closes, and the request counts with that head's status plus an
    /// abort reason (`weir_responses_aborted_total`, the access log's `aborted`).
    Head,
}

impl Reached {
    /// Short of the final head: `Interim` once a 1xx went to the client.
    pub fn before_head(interim_sent: bool) -> Reached {
        match interim_sent {
            true => Reached::Interim,
            false => Reached::Nothing,
        }
    }
}

/// A failed exchange: what went wrong and how far the response had got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub error: ProxyError,
    pub reached: Reached,
}

impl Failure {
    /// A failure once the final response head was being sent.
    pub fn after_head(error: ProxyError) -> Failure {
        Failure {
            error,
            reached: Reached::Head,
        }
    }
}

impl From<ProxyError> for Failure {
    fn from(error: ProxyError) -> Failure {
        Failure {
            error,
            reached: Reached::Nothing,
        }
    }
}
