//! The one filter every trailer section passes through, whatever the protocols on either
//! side: an HTTP/1.1 chunked body's trailer lines re-written for an HTTP/1.1 peer
//! ([`push_lines`]: `forward::relay::Http1Sink`, and a whole request body in place,
//! `BodyState::rewrite_trailers`), or made into an HTTP/2 or HTTP/3 client's trailing
//! HEADERS (`http2::trailers::to_h2`), and an HTTP/2 or HTTP/3 peer's trailer fields
//! (`http2::trailers::keep`, `Http1Sink`). The fields an HTTP/1.1 head (an upstream's
//! response, a client's request) lists in `Connection` leave its trailer section at the
//! source ([`connection_listed`], `relay::Http1Source`, `RequestBody` for a whole request
//! body toward an HTTP/2 upstream), whatever the other side.
//!
//! A client's trailer fields also lose every name its request head does not carry
//! upstream as it came ([`request_drops`]: `request_head::HeadNames`, the head writer's
//! own decision, and the names the head's `Connection` lists): the forwarded headers
//! Weir sets, the client-certificate header, the request id, the route's
//! `request_headers` `set` and `remove` names, a sampled request's trace context. An
//! upstream that merges trailers into the header section (Go's `net/http` hands them to
//! the handler; some frameworks merge them) would otherwise take a client's own
//! `X-Forwarded-For` or certificate for Weir's. This holds on every path a request's
//! trailers take: an HTTP/1.1 upstream's (`BodyState::rewrite_trailers` for a body
//! whole with its head, `relay::Http1Sink` for one streamed, an HTTP/2 or HTTP/3
//! client's chunked upload among them) and an HTTP/2 upstream's (`relay::H2Upload`, an
//! HTTP/1.1 client's chunked section made into fields). A response's trailer fields lose
//! what the route's `response_headers` and compression take out of its head
//! (`forward::head::Edits::drops`), on every path too.
//!
//! Only a chunked HTTP/1.1 body has a trailer section: a message framed any other way (or
//! without a body) pays nothing for this module (`forward::exchange::take_buffered` frames
//! it as it always did, [`connection_listed`] is one comparison), and nothing here runs
//! until a section arrives.
//!
//! A trailer arrives after the body a recipient may already have acted on, and some
//! recipients merge it into the header section: a field that frames, routes,
//! authenticates or controls the message there (RFC 9110 6.5.1, 6.5.2) would mislead
//! them, and a hop-by-hop one (RFC 9110 7.6.1) is the sender's connection's, not the
//! next hop's. Those are never relayed ([`relayed`]), nor is a name that is not a token
//! (an HTTP/2 peer's `"`; an HTTP/1.1 line that is not a field). The chunked decoder
//! already refuses such lines in an HTTP/1.1 trailer section, ending the message as a
//! bad chunk ends it (HAProxy rejects the message too); the checks here are the same
//! for every source, so a line that passed nothing still cannot reach a peer.

use super::driver::Exchange;
use super::request_head::HeadNames;
use crate::codec::http1::header::{is_token, tokens, trim};
use crate::codec::http1::{BodyFraming, HeaderKind, HeaderSpan, RequestHead};

/// Fields a trailer must not carry (RFC 9110 6.5.1, 6.5.2): framing, routing,
/// authentication, cookies, controls and fields that change how the body already sent is
/// read or cached, and request modifiers (a range, conditionals, an expectation) that an
/// upstream merging trailers into the head would honour after the fact. The hop-by-hop
/// ones are `HeaderKind`'s.
const FORBIDDEN: [&[u8]; 26] = [
    b"content-length",
    b"host",
    b"authorization",
    b"proxy-authorization",
    b"www-authenticate",
    b"proxy-authenticate",
    b"set-cookie",
    b"cookie",
    b"content-type",
    b"content-encoding",
    b"content-range",
    b"cache-control",
    b"expires",
    b"age",
    b"date",
    b"location",
    b"retry-after",
    b"vary",
    b"max-forwards",
    b"range",
    b"if-range",
    b"if-match",
    b"if-none-match",
    b"if-modified-since",
    b"if-unmodified-since",
    b"expect",
];

/// Whether a trailer field named `name` (any case) may be relayed: a token, neither
/// hop-by-hop (`Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, ...) nor one
/// a trailer must not carry.
pub(crate) fn relayed(name: &[u8]) -> bool {
    is_token(name)
        && !HeaderKind::of(name).is_hop_by_hop()
        && !FORBIDDEN.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// The fields of a raw trailer section `lines` (field lines, each ending in CRLF, as the
/// chunked decoder keeps them): `(line, name, value)` (the line without its line end, the
/// value trimmed), or `None` for a line that is not a field: no `:`, a name that is not a
/// token (an obs-fold's leading space included), a control byte (CR, LF, NUL, ...) in the
/// value.
pub(crate) fn fields(lines: &[u8]) -> impl Iterator<Item = Option<(&[u8], &[u8], &[u8])>> {
    lines
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|b| *b == b':')?;
            let (name, value) = (&line[..colon], &line[colon + 1..]);
            let clean = |b: &u8| *b == b'\t' || (*b >= 0x20 && *b != 0x7f);
            (is_token(name) && value.iter().all(clean)).then(|| (line, name, trim(value)))
        })
}

/// Appends the fields of `lines` (as [`fields`] reads them) that may be relayed and that
/// `dropped` does not take (the names the route took out of the head), each as it came
/// but ended with CRLF: never longer than `lines`. Returns how many lines were left out.
pub(crate) fn push_lines(
    out: &mut Vec<u8>,
    lines: &[u8],
    dropped: impl Fn(&[u8]) -> bool,
) -> usize {
    let mut left_out = 0;
    for field in fields(lines) {
        match field {
            Some((line, name, _)) if relayed(name) && !dropped(name) => {
                out.extend_from_slice(line);
                out.extend_from_slice(b"\r\n");
            }
            _ => left_out += 1,
        }
    }
    if left_out > 0 {
        tracing::debug!(left_out, "trailer fields not relayed");
    }
    left_out
}

/// The values of the `Connection` fields of a head (its `headers`, parsed from `buf`),
/// joined by commas, when they name fields and its body is chunked (`framing`): the
/// fields they name are the connection's (RFC 9110 7.6.1), in the trailer section too
/// ([`listed_in`]). Empty, without an allocation, for any other message (most name none:
/// `keep-alive`, `close`); a body that is not chunked costs the one comparison.
#[inline]
pub(crate) fn connection_listed(
    buf: &[u8],
    headers: &[HeaderSpan],
    framing: BodyFraming,
) -> Vec<u8> {
    match framing {
        BodyFraming::Chunked => listed_names(buf, headers),
        _ => Vec::new(),
    }
}

/// [`connection_listed`]'s values, for a chunked body.
#[inline(never)]
fn listed_names(buf: &[u8], headers: &[HeaderSpan]) -> Vec<u8> {
    let mut listed = Vec::new();
    let options: [&[u8]; 3] = [b"close", b"keep-alive", b"upgrade"];
    let connection = headers.iter().filter(|h| h.kind == HeaderKind::Connection);
    for value in connection.map(|h| &buf[h.value.clone()]) {
        if tokens(value).any(|t| !options.iter().any(|o| t.eq_ignore_ascii_case(o))) {
            listed.extend_from_slice(value);
            listed.push(b',');
        }
    }
    listed
}

/// Whether the `Connection` values `listed` ([`connection_listed`]) name `name`.
pub(crate) fn listed_in(listed: &[u8], name: &[u8]) -> bool {
    tokens(listed).any(|t| t.eq_ignore_ascii_case(name))
}

/// Which of the HTTP/1.1 request `req`'s trailer fields (its head at the start of `buf`;
/// `x`: its exchange) stay out besides those no trailer may carry ([`relayed`]): the
/// names its head does not carry upstream as they came (`HeadNames`), and those the
/// head's `Connection` lists. Only a chunked body has trailers: make this for one, once
/// it has them.
pub(crate) fn request_drops<'a>(
    x: &Exchange<'a>,
    buf: &[u8],
    req: &RequestHead,
) -> impl Fn(&[u8]) -> bool + 'a {
    let names = HeadNames::of(&x.target, x.trace.is_some());
    let listed = connection_listed(buf, &req.headers, req.framing);
    move |name| !names.forwards(name) || listed_in(&listed, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_hop_by_hop_and_non_token_names_are_not_relayed() {
        for name in [
            &b"Content-Length"[..],
            b"Range",
            b"If-None-Match",
            b"TRANSFER-ENCODING",
            b"host",
            b"Trailer",
            b"TE",
            b"Connection",
            b"Keep-Alive",
            b"Proxy-Connection",
            b"Upgrade",
            b"Authorization",
            b"Set-Cookie",
            b"Cache-Control",
            b"x\"quoted",
            b"X T",
            b"",
        ] {
            assert!(!relayed(name), "{}", String::from_utf8_lossy(name));
        }
        for name in [&b"X-Checksum"[..], b"grpc-status", b"Server-Timing"] {
            assert!(relayed(name), "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn lines_are_kept_as_they_came_with_crlf_the_rest_left_out() {
        let lines = b"X-A: 1\r\nContent-Length: 5\r\nX-B:2\nbad line\r\n folded\r\n\
            X-C: a\x00b\r\nX-D: a\rb\r\nX-Secret: s\r\nx-a:  3 \r\n";
        let mut out = Vec::new();
        let left_out = push_lines(&mut out, lines, |n| n.eq_ignore_ascii_case(b"x-secret"));
        assert_eq!(out, b"X-A: 1\r\nX-B:2\r\nx-a:  3 \r\n");
        assert_eq!(left_out, 6);
        let mut out = Vec::new();
        assert_eq!(push_lines(&mut out, b"", |_| false), 0);
        assert!(out.is_empty());
    }

    #[test]
    fn names_the_heads_connection_lists_are_found() {
        use crate::codec::http1::{parse_response, ResponseHead};
        let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: X-Hop, close\r\n\
            Transfer-Encoding: chunked\r\n\r\n";
        let mut resp = ResponseHead::default();
        assert!(parse_response(raw, raw.len(), false, &mut resp).unwrap());
        let listed = connection_listed(raw, &resp.headers, resp.framing);
        assert!(listed_in(&listed, b"x-hop") && !listed_in(&listed, b"x-end"));
        // Only a chunked body has trailers.
        let sized = connection_listed(raw, &resp.headers, BodyFraming::Length(2));
        assert!(sized.is_empty() && sized.capacity() == 0);
        let plain =
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(parse_response(plain, plain.len(), false, &mut resp).unwrap());
        assert!(connection_listed(plain, &resp.headers, resp.framing).is_empty());
    }

    #[test]
    fn fields_give_trimmed_values() {
        let all: Vec<_> = fields(b"A:  x y \r\nB:\r\n").collect();
        assert_eq!(
            all,
            [
                Some((&b"A:  x y "[..], &b"A"[..], &b"x y"[..])),
                Some((&b"B:"[..], &b"B"[..], &b""[..]))
            ]
        );
    }
}
