//! The one error type of the data plane and its single mapping to an HTTP status.
//!
//! Every failure on the request path becomes a `ProxyError`. Its side (client, upstream,
//! internal) says who is at fault; `status()` says what the client is told, in exactly one
//! place. Errors carry no heap data so that raising one allocates nothing.

use std::io;

/// Who caused a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Upstream,
    Internal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    #[error("request head too large")]
    HeadTooLarge,
    #[error("request body too large")]
    BodyTooLarge,
    #[error("request head not received within header_timeout")]
    HeaderTimeout,
    #[error("client too slow (client_timeout)")]
    ClientTimeout,
    /// A request body slower than the listener's `min_body_rate` (`time::Pace`).
    #[error("request body slower than min_body_rate")]
    BodyTooSlow,
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("expectation failed")]
    ExpectationFailed,
    /// A request received in TLS early data (0-RTT) that is not safe to replay (RFC 8470).
    #[error("request in early data is not safe to replay")]
    TooEarly,
    #[error("HTTP version not supported")]
    VersionNotSupported,
    /// An RFC 8441 extended CONNECT past the connection's `http2.max_tunnels`.
    #[error("too many WebSocket tunnels on one HTTP/2 connection")]
    TooManyTunnels,
    #[error("client closed the connection")]
    ClientClosed,
    #[error("client I/O error: {0:?}")]
    ClientIo(io::ErrorKind),
    #[error("upstream connect failed: {0:?}")]
    UpstreamConnect(io::ErrorKind),
    #[error("upstream connect timed out")]
    UpstreamConnectTimeout,
    /// The TLS handshake with the upstream failed (the reason is logged where it failed).
    #[error("upstream TLS handshake failed: {0}")]
    UpstreamTls(&'static str),
    #[error("upstream closed the connection before a complete response")]
    UpstreamClosed,
    #[error("upstream I/O error: {0:?}")]
    UpstreamIo(io::ErrorKind),
    #[error("malformed upstream response: {0}")]
    UpstreamMalformed(&'static str),
    /// The upstream's response head is past Weir's bounds (16 KiB, 128 fields): a 502, but
    /// never the server's failure for passive health, since an application that reflects
    /// the request into its head (a `Location` with the URL) would otherwise let any
    /// client eject a healthy server with one long request.
    #[error("upstream response head too large")]
    UpstreamHeadTooLarge,
    /// An upgrade's answer that makes no tunnel (a 2xx to a WebSocket handshake, a 101
    /// the request cannot take): a 502, as the upstream's answer, but one the client's
    /// request provoked, so never the server's failure for passive health
    /// (`upstream::retry::Outcome::of_error`), or any client could eject healthy servers.
    #[error("upgrade not made: {0}")]
    UpgradeNotMade(&'static str),
    #[error("upstream response timed out")]
    UpstreamTimeout,
    #[error("no healthy upstream server")]
    NoServer,
    /// Weir could not open an upstream connection for want of its own resources (file
    /// descriptors, local ports, socket memory): a 503, and never the server's failure,
    /// or a client holding Weir's descriptors would get healthy servers ejected.
    #[error("out of local resources to connect upstream: {0}")]
    LocalResources(&'static str),
}

impl ProxyError {
    pub fn side(self) -> Side {
        use ProxyError::*;
        match self {
            BadRequest(_) | HeadTooLarge | BodyTooLarge | HeaderTimeout | ClientTimeout
            | BodyTooSlow | NotImplemented(_) | MethodNotAllowed | ExpectationFailed
            | VersionNotSupported | TooEarly | TooManyTunnels | ClientClosed | ClientIo(_) => {
                Side::Client
            }
            UpstreamConnect(_)
            | UpstreamConnectTimeout
            | UpstreamTls(_)
            | UpstreamClosed
            | UpstreamIo(_)
            | UpstreamMalformed(_)
            | UpstreamHeadTooLarge
            | UpgradeNotMade(_)
            | UpstreamTimeout => Side::Upstream,
            NoServer | LocalResources(_) => Side::Internal,
        }
    }

    /// The status to answer with, or `None` when the client cannot be answered (it left).
    pub fn status(self) -> Option<u16> {
        use ProxyError::*;
        Some(match self {
            BadRequest(_) => 400,
            MethodNotAllowed => 405,
            HeaderTimeout | ClientTimeout | BodyTooSlow => 408,
            BodyTooLarge => 413,
            ExpectationFailed => 417,
            TooEarly => 425,
            // The client's own excess, which it may retry once one of its tunnels ends.
            TooManyTunnels => 429,
            HeadTooLarge => 431,
            NotImplemented(_) => 501,
            UpstreamConnect(_) | UpstreamTls(_) | UpstreamClosed | UpstreamIo(_)
            | UpstreamMalformed(_) | UpstreamHeadTooLarge | UpgradeNotMade(_) => 502,
            NoServer | LocalResources(_) => 503,
            UpstreamConnectTimeout | UpstreamTimeout => 504,
            VersionNotSupported => 505,
            ClientClosed | ClientIo(_) => return None,
        })
    }

    /// The body of Weir's own error response when it says more than the reason phrase.
    pub fn body_text(self) -> Option<&'static str> {
        match self {
            ProxyError::NoServer => Some("no healthy upstream server"),
            ProxyError::LocalResources(what) => Some(what),
            ProxyError::TooManyTunnels => Some("too many WebSocket tunnels on this connection"),
            _ => None,
        }
    }

    pub fn client_io(e: io::Error) -> ProxyError {
        ProxyError::ClientIo(e.kind())
    }

    pub fn upstream_io(e: io::Error) -> ProxyError {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => ProxyError::UpstreamClosed,
            kind => ProxyError::UpstreamIo(kind),
        }
    }
}

/// The reason phrase for the statuses Weir itself generates.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        408 => "Request Timeout",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        425 => "Too Early",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answerable_error_has_a_reason_phrase() {
        let all = [
            ProxyError::BadRequest("x"),
            ProxyError::HeadTooLarge,
            ProxyError::BodyTooLarge,
            ProxyError::HeaderTimeout,
            ProxyError::NotImplemented("x"),
            ProxyError::MethodNotAllowed,
            ProxyError::ExpectationFailed,
            ProxyError::TooEarly,
            ProxyError::TooManyTunnels,
            ProxyError::VersionNotSupported,
            ProxyError::UpstreamConnect(io::ErrorKind::ConnectionRefused),
            ProxyError::UpstreamConnectTimeout,
            ProxyError::UpstreamTls("x"),
            ProxyError::UpstreamMalformed("x"),
            ProxyError::UpgradeNotMade("x"),
            ProxyError::UpstreamTimeout,
            ProxyError::NoServer,
        ];
        for e in all {
            let status = e.status().unwrap();
            assert!(!reason_phrase(status).is_empty(), "{e}");
        }
        assert_eq!(ProxyError::ClientClosed.status(), None);
    }
}
