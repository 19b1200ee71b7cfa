//! A response head on its way to the client, in every cell: what the route does to it
//! ([`Edits`], described once: hop-by-hop and `Connection`-listed fields dropped, locations
//! mapped back (`reverse_rewrite`), the `response_headers` rules, the compression plan, the
//! sticky-session cookie), and its writing as HTTP/1.1 for an HTTP/1.x client from either
//! upstream's head ([`write_from_http1`]: the upstream's lines copied in runs;
//! [`write_from_h2`]: an HTTP/2 upstream's fields; 1xx heads by `h1::Http1Interim`).
//! An HTTP/2 client's head is built from the same `Edits` (`http2::respond::head_from_http1`
//! / `head_from_h2`), as an HTTP/3 client's is.

use http::{HeaderMap, StatusCode};
use weir_config::{HeaderRules, Route, UpstreamServer};

use super::h2::is_connection_specific;
use crate::codec::http1::write::{push_header, push_status_line, HeaderLines, Persistence};
use crate::codec::http1::{BodyFraming, HeaderKind, ResponseHead};
use crate::codec::Fields;
use crate::filters::compression::Plan;
use crate::filters::location::ReverseMap;

/// What the route does to one response's head.
#[derive(Default)]
pub(crate) struct Edits<'a> {
    /// The route's `response_headers` and their lines, rendered when the request was read
    /// (the variables come from the request).
    pub rules: Option<(&'a HeaderRules, &'a [u8])>,
    /// `reverse_rewrite`: location fields mapped back to the public authority and prefix.
    pub reverse: Option<ReverseMap<'a>>,
    /// What compression does to this response.
    pub plan: Plan,
    /// The sticky-session `Set-Cookie: ...` line (CRLF included).
    pub cookie: Option<&'a [u8]>,
}

impl<'a> Edits<'a> {
    /// The route's edits for a response from `server` to a request for `host` (the
    /// client's `Host`, empty when it sent none).
    pub fn of(
        route: &'a Route,
        lines: &'a [u8],
        server: &'a UpstreamServer,
        host: &'a [u8],
    ) -> Self {
        let rules = route.filters.response_headers.as_ref();
        Edits {
            rules: rules.map(|r| (r, lines)),
            reverse: route.reverse_rewrite.then(|| ReverseMap {
                upstream_authority: server.name.as_bytes(),
                public_authority: (!host.is_empty()).then_some(host),
                upstream_prefix: route
                    .rewrite_prefix
                    .as_deref()
                    .unwrap_or(&route.path_prefix),
                public_prefix: &route.path_prefix,
            }),
            plan: Plan::default(),
            cookie: None,
        }
    }

    /// The part of a `route`'s edits that trailer fields get (the names its rules and the
    /// compression `plan` take out of the head), without the rendered lines a response's
    /// edits borrow from its connection.
    pub fn dropping(route: &'a Route, plan: Plan) -> Self {
        let rules = route.filters.response_headers.as_ref();
        Edits {
            rules: rules.map(|r| (r, &[][..])),
            plan,
            ..Edits::default()
        }
    }

    /// Whether a field of the upstream's head named `name` stays out of the client's.
    pub fn drops(&self, name: &[u8]) -> bool {
        self.plan.drops(name) || self.rules.is_some_and(|(r, _)| r.drops(name))
    }

    /// Whether no field of the upstream's head is dropped or rewritten.
    pub fn keeps_fields(&self) -> bool {
        self.rules.is_none() && self.reverse.is_none() && !self.plan.drops_any()
    }

    /// Appends the location field (`kind`) `value` mapped back through `reverse_rewrite`;
    /// false (nothing appended) when it is not one, or not the upstream's own URL.
    pub fn map_location(&self, kind: HeaderKind, value: &[u8], out: &mut Vec<u8>) -> bool {
        is_location(kind)
            && self
                .reverse
                .as_ref()
                .is_some_and(|m| m.map_into(value, out))
    }

    /// Appends the line `name: value` of a field of `kind`, a location mapped back.
    fn push_field(&self, out: &mut Vec<u8>, kind: HeaderKind, name: &[u8], value: &[u8]) {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        if !self.map_location(kind, value, out) {
            out.extend_from_slice(value);
        }
        out.extend_from_slice(b"\r\n");
    }

    /// Appends the lines the edits add after the upstream's fields: the rules', the
    /// plan's (from the upstream's `fields`), the cookie.
    pub fn push_lines(&self, out: &mut Vec<u8>, fields: Fields<'_>) {
        if let Some((_, lines)) = self.rules {
            out.extend_from_slice(lines);
        }
        if self.plan != Plan::default() {
            self.plan.push_lines(out, fields);
        }
        if let Some(line) = self.cookie {
            out.extend_from_slice(line);
        }
    }
}

/// How the head presents the client connection.
#[derive(Default)]
pub struct ClientFraming {
    /// The body is re-framed from chunked to close-delimited (HTTP/1.0 client).
    pub dechunk: bool,
    /// Weir closes the client connection after this response.
    pub close: bool,
    /// The client speaks HTTP/1.0 (needs an explicit keep-alive).
    pub http10: bool,
}

/// Appends HTTP/2 `fields` as HTTP/1.1 lines (lower-case names, as HTTP/2 has them) but
/// connection-specific and `dropped` ones.
pub(crate) fn push_fields(out: &mut Vec<u8>, fields: &HeaderMap, dropped: impl Fn(&str) -> bool) {
    for (name, value) in fields {
        if is_connection_specific(name) || dropped(name.as_str()) {
            continue;
        }
        push_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

/// Appends the client's head for an HTTP/1.1 upstream's `resp` (parsed from `buf`).
pub(crate) fn write_from_http1(
    out: &mut Vec<u8>,
    buf: &[u8],
    resp: &ResponseHead,
    edits: &Edits<'_>,
    framing: &ClientFraming,
) {
    push_status_line(out, resp.status, &buf[resp.reason.clone()]);
    // Separate loops so that a route without edits runs exactly the copy it always ran.
    match edits.keeps_fields() {
        true => copy_lines(out, buf, resp, edits, |_| false),
        false => copy_lines(out, buf, resp, edits, |name| edits.drops(name)),
    }
    let fields = Fields::Http1 {
        buf,
        headers: &resp.headers,
    };
    edits.push_lines(out, fields);
    let chunked = resp.framing == BodyFraming::Chunked && !framing.dechunk;
    if chunked || edits.plan.encoding.is_some() {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if resp.status == 101 {
        out.extend_from_slice(b"Connection: upgrade\r\n");
        let upgrades = resp
            .headers
            .iter()
            .filter(|h| h.kind == HeaderKind::Upgrade);
        for h in upgrades {
            push_header(out, b"Upgrade", &buf[h.value.clone()]);
        }
    } else {
        Persistence::of(!framing.close, framing.http10).push_header(out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Copies the end-to-end header lines (location fields mapped back), except those whose
/// names are `dropped`; unchanged lines in runs.
#[inline]
fn copy_lines(
    out: &mut Vec<u8>,
    buf: &[u8],
    resp: &ResponseHead,
    edits: &Edits<'_>,
    dropped: impl Fn(&[u8]) -> bool,
) {
    let mut lines = HeaderLines::default();
    for h in &resp.headers {
        if h.connection_listed || h.kind.is_hop_by_hop() || dropped(&buf[h.name.clone()]) {
            continue;
        }
        if edits.reverse.is_none() || !is_location(h.kind) {
            lines.keep(out, buf, h);
            continue;
        }
        lines.flush(out, buf);
        edits.push_field(out, h.kind, &buf[h.name.clone()], &buf[h.value.clone()]);
    }
    lines.flush(out, buf);
}

fn is_location(kind: HeaderKind) -> bool {
    matches!(
        kind,
        HeaderKind::Location | HeaderKind::ContentLocation | HeaderKind::Uri
    )
}

/// How an HTTP/2 upstream's body goes to an HTTP/1.x client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (HEAD, 204, 304, or an empty one: `Content-Length: 0`).
    Empty,
    /// The server's `content-length` (the `h2` crate checks the DATA against it).
    Length,
    Chunked,
    /// An HTTP/1.0 client and no length: the body ends with the connection.
    UntilClose,
}

/// What an HTTP/2 upstream's head is written for: what the client asked.
#[derive(Clone, Copy)]
pub(crate) struct ForClient {
    pub is_head: bool,
    pub http10: bool,
    /// `TE: trailers`: the client takes trailer fields in a chunked body.
    pub te_trailers: bool,
    /// The coding the route's `compression` negotiated with the client.
    pub accepted: Option<weir_config::Encoding>,
    /// The response ends with its HEADERS frame.
    pub end_stream: bool,
    /// The client connection may stay open, as far as the request goes.
    pub keep_alive: bool,
}

/// Appends the client's HTTP/1.1 head for an HTTP/2 upstream's `parts`; returns the body's
/// framing and whether the client connection stays open.
pub(crate) fn write_from_h2(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    edits: &Edits<'_>,
    client: &ForClient,
) -> (Framing, bool) {
    let status = parts.status;
    push_status_line(out, status.as_u16(), reason(status));
    for (name, value) in &parts.headers {
        if is_connection_specific(name) || edits.drops(name.as_str().as_bytes()) {
            continue;
        }
        let name = name.as_str().as_bytes();
        edits.push_field(out, HeaderKind::of(name), name, value.as_bytes());
    }
    edits.push_lines(out, Fields::Http2(&parts.headers));
    let bodiless = client.is_head || status == StatusCode::NO_CONTENT || status.as_u16() == 304;
    let framing = if bodiless {
        Framing::Empty
    } else if edits.plan.encoding.is_none()
        && parts.headers.contains_key(http::header::CONTENT_LENGTH)
    {
        Framing::Length
    } else if client.end_stream {
        out.extend_from_slice(b"Content-Length: 0\r\n");
        Framing::Empty
    } else if client.http10 {
        Framing::UntilClose
    } else {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        Framing::Chunked
    };
    let keep_alive = client.keep_alive && framing != Framing::UntilClose;
    Persistence::of(keep_alive, client.http10).push_header(out);
    out.extend_from_slice(b"\r\n");
    (framing, keep_alive)
}

/// An HTTP/2 status's reason phrase.
pub(crate) fn reason(status: StatusCode) -> &'static [u8] {
    status.canonical_reason().unwrap_or("").as_bytes()
}

/// What the route's compression does to a response (nothing without `compression`): `r`
/// as the plan sees it.
pub(crate) fn plan(route: &Route, r: &crate::filters::compression::Response<'_>) -> Plan {
    match &route.filters.compression {
        Some(cfg) => crate::filters::compression::plan(cfg, r),
        None => Plan::default(),
    }
}

/// The compression plan for an HTTP/1.1 upstream's `resp` (parsed from `buf`), answering
/// a request (`is_head`: a HEAD) whose client accepts `accepted`.
pub(crate) fn plan_http1(
    route: &Route,
    buf: &[u8],
    resp: &ResponseHead,
    is_head: bool,
    accepted: Option<weir_config::Encoding>,
) -> Plan {
    let fields = Fields::Http1 {
        buf,
        headers: &resp.headers,
    };
    let response = crate::filters::compression::Response {
        status: resp.status,
        fields,
        framing: resp.framing,
        is_head,
        accepted,
        rules: route.filters.response_headers.as_ref(),
    };
    plan(route, &response)
}

/// The compression of a response whose plan has an encoding (`None`: sent as it is).
/// `length`: the uncompressed body's, when known. `Err`: the compressor did not start,
/// refused before any of the response went out.
pub(crate) fn coding(
    route: &Route,
    plan: &Plan,
    length: Option<u64>,
) -> Result<Option<super::relay::Coding>, crate::error::ProxyError> {
    let (Some(encoding), Some(cfg)) = (plan.encoding, &route.filters.compression) else {
        return Ok(None);
    };
    let encoder = crate::filters::compression::Encoder::new(encoding, &cfg.levels, length)
        .map_err(|_| super::relay::COMPRESSOR_FAILED)?;
    let counts = crate::filters::compression::Compressed {
        encoding,
        bytes_in: 0,
        bytes_out: 0,
    };
    Ok(Some(super::relay::Coding { encoder, counts }))
}

#[cfg(test)]
mod tests {
    use super::{write_from_h2, Edits, ForClient, Framing};

    fn parts(status: u16, fields: &[(&str, &str)]) -> http::response::Parts {
        let mut builder = http::Response::builder().status(status);
        for (n, v) in fields {
            builder = builder.header(*n, *v);
        }
        builder.body(()).expect("response").into_parts().0
    }

    fn head(ask: ForClient, end_stream: bool) -> ForClient {
        ForClient { end_stream, ..ask }
    }

    fn write_head(out: &mut Vec<u8>, p: &http::response::Parts, c: &ForClient) -> (Framing, bool) {
        write_from_h2(out, p, &Edits::default(), c)
    }

    const GET11: ForClient = ForClient {
        is_head: false,
        http10: false,
        te_trailers: false,
        accepted: None,
        end_stream: false,
        keep_alive: true,
    };

    #[test]
    fn head_framing_follows_length_status_and_client_version() {
        let mut out = Vec::new();
        let p = parts(200, &[("content-length", "5"), ("x-a", "1")]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Length, true)
        );
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\n"
        );
        out.clear();
        let p = parts(200, &[]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Chunked, true)
        );
        assert!(out.ends_with(b"Transfer-Encoding: chunked\r\n\r\n"));
        out.clear();
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, true)),
            (Framing::Empty, true)
        );
        assert!(out.ends_with(b"Content-Length: 0\r\n\r\n"));
        out.clear();
        let http10 = ForClient {
            http10: true,
            ..GET11
        };
        assert_eq!(
            write_head(&mut out, &p, &head(http10, false)),
            (Framing::UntilClose, false)
        );
        assert!(out.ends_with(b"Connection: close\r\n\r\n"));
        out.clear();
        let head_req = ForClient {
            is_head: true,
            ..GET11
        };
        let p = parts(200, &[("content-length", "99")]);
        assert_eq!(
            write_head(&mut out, &p, &head(head_req, true)),
            (Framing::Empty, true)
        );
        assert!(out.ends_with(b"content-length: 99\r\n\r\n"));
        out.clear();
        let p = parts(204, &[]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Empty, true)
        );
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");
    }
}
