//! gRPC answers Weir makes itself on HTTP/2 and HTTP/3 streams: the `grpc-status` for an HTTP status or
//! a proxy failure, and the trailers-only response that carries it (HTTP 200,
//! `content-type: application/grpc`, `grpc-status`, percent-encoded `grpc-message`,
//! END_STREAM). A gRPC client library reads a usable status from it instead of reporting
//! "unexpected HTTP status" or "missing grpc-status" (docs/http2.md, gRPC).
//!
//! The access log and metrics count such an answer with the HTTP status Weir meant (404,
//! 429, 502, ...), not the 200 on the wire, so dashboards and alerts keep working.

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};

use crate::error::{reason_phrase, ProxyError};

/// gRPC status codes Weir answers with (grpc/doc/statuscodes.md).
const UNKNOWN: u8 = 2;
const DEADLINE_EXCEEDED: u8 = 4;
const PERMISSION_DENIED: u8 = 7;
const RESOURCE_EXHAUSTED: u8 = 8;
const UNIMPLEMENTED: u8 = 12;
const INTERNAL: u8 = 13;
const UNAVAILABLE: u8 = 14;
const UNAUTHENTICATED: u8 = 16;

/// The longest answer body used as `grpc-message`; a longer one (an HTML page) gives the
/// reason phrase instead.
const MAX_MESSAGE: usize = 512;

/// The gRPC status for an answer Weir makes with HTTP `status`: grpc's HTTP-to-gRPC table
/// (the one Envoy uses), except that 429 and 413 are RESOURCE_EXHAUSTED. Weir answers as
/// the server here, so it picks the code that says what happened: a rate limit or size
/// limit is a quota, and UNAVAILABLE would invite the client's retry policy (which
/// usually lists UNAVAILABLE) to hammer the limit (Envoy's
/// `rate_limited_as_resource_exhausted` makes the same choice).
pub fn code_for_status(status: u16) -> u8 {
    match status {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        413 | 429 => RESOURCE_EXHAUSTED,
        502..=504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

/// The gRPC status for a failure Weir answers: a timeout waiting for the server is
/// DEADLINE_EXCEEDED, an unreachable, missing or failing server UNAVAILABLE, anything else
/// the code of its HTTP status.
pub fn code_for_error(error: ProxyError, status: u16) -> u8 {
    use ProxyError::*;
    match error {
        UpstreamTimeout => DEADLINE_EXCEEDED,
        NoServer
        | UpstreamConnect(_)
        | UpstreamConnectTimeout
        | UpstreamTls(_)
        | UpstreamClosed
        | UpstreamIo(_)
        | UpstreamMalformed(_) => UNAVAILABLE,
        _ => code_for_status(status),
    }
}

/// Whether a local answer with `status` to a gRPC request is sent as a gRPC status: every
/// status but a 2xx, which the user wrote on purpose (a `respond` rule) and is sent as is.
pub fn translates(status: u16) -> bool {
    !(200..300).contains(&status)
}

/// The `grpc-message` for an answer with `status` and `body`: the body's text when it is
/// short and not empty, else the reason phrase.
pub fn message(status: u16, body: &[u8]) -> &[u8] {
    let text = body.trim_ascii();
    match text.is_empty() || text.len() > MAX_MESSAGE {
        true => reason_phrase(status).as_bytes(),
        false => text,
    }
}

/// The trailers-only response with `code` and `message` (percent-encoded here), and the
/// fields of `extra` (`WWW-Authenticate`, `Retry-After`, `Location`, ...): a head that
/// ends the stream (HTTP/2 or HTTP/3).
pub fn status_head(code: u8, message: &[u8], extra: HeaderMap) -> http::Response<()> {
    let mut head = http::Response::new(());
    *head.headers_mut() = extra;
    let headers = head.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", u16::from(code).into());
    let mut encoded = Vec::with_capacity(message.len());
    percent_encode(message, &mut encoded);
    // An empty message (a status without a reason phrase, and no body) is left out.
    let value = HeaderValue::from_bytes(&encoded).ok();
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        headers.insert("grpc-message", v);
    }
    head
}

/// Appends `message` to `out` percent-encoded as gRPC's `grpc-message` wants: printable
/// ASCII but `%` as is, every other byte (UTF-8 included) as `%XX`.
fn percent_encode(message: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in message {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        percent_encode(message, &mut out);
        out
    }

    #[test]
    fn percent_encodes_percent_controls_and_utf8_only() {
        assert_eq!(encoded(b"Not Found"), b"Not Found");
        assert_eq!(encoded(b"100% done\n"), b"100%25 done%0A");
        assert_eq!(encoded("héllo".as_bytes()), b"h%C3%A9llo");
        assert_eq!(encoded(b"\x7f~ "), b"%7F~ ");
    }

    #[test]
    fn maps_http_statuses_as_grpc_and_envoy_do_but_quotas() {
        let cases = [
            (400, INTERNAL),
            (401, UNAUTHENTICATED),
            (403, PERMISSION_DENIED),
            (404, UNIMPLEMENTED),
            (413, RESOURCE_EXHAUSTED),
            (429, RESOURCE_EXHAUSTED),
            (502, UNAVAILABLE),
            (503, UNAVAILABLE),
            (504, UNAVAILABLE),
            (301, UNKNOWN),
            (500, UNKNOWN),
            (501, UNKNOWN),
        ];
        for (status, code) in cases {
            assert_eq!(code_for_status(status), code, "{status}");
        }
        assert_eq!(code_for_error(ProxyError::UpstreamTimeout, 504), 4);
        assert_eq!(code_for_error(ProxyError::NoServer, 503), 14);
        assert_eq!(code_for_error(ProxyError::BodyTooLarge, 413), 8);
    }

    #[test]
    fn message_is_the_short_body_or_the_reason_phrase() {
        assert_eq!(message(403, b"Forbidden\n"), b"Forbidden");
        assert_eq!(message(503, b" back soon \n"), b"back soon");
        assert_eq!(message(404, b""), b"Not Found");
        assert_eq!(message(404, &[b'x'; MAX_MESSAGE + 1]), b"Not Found");
        assert!(translates(404) && translates(302) && !translates(200) && !translates(204));
    }
}
