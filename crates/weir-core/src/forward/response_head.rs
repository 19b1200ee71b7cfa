//! Writing the client response head: status line, end-to-end headers byte for byte (with
//! ProxyPassReverse on location headers), framing and the client connection's persistence.

use crate::codec::http1::write::{push_header, push_status_line, HeaderLines, Persistence};
use crate::codec::http1::{BodyFraming, HeaderKind, ResponseHead};
use crate::filters::compression::Plan;
use crate::filters::location::ReverseMap;
use weir_config::HeaderRules;

/// How the head should present the client connection.
pub struct ClientFraming {
    /// The body is re-framed from chunked to close-delimited (HTTP/1.0 client).
    pub dechunk: bool,
    /// Weir closes the client connection after this response.
    pub close: bool,
    /// The client speaks HTTP/1.0 (needs an explicit keep-alive).
    pub http10: bool,
    /// What the route's compression does to this response (default: nothing). A
    /// compressed body goes out chunked, without the upstream's length and validators.
    pub coding: Plan,
}

/// The route's `response_headers` and their lines, rendered when the request was read
/// (the variables come from the request, whose head is gone by now).
pub type ResponseEdits<'a> = (&'a HeaderRules, &'a [u8]);

/// Appends the client response head for `resp` (parsed from `buf`) to `out`.
pub fn write_response_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    resp: &ResponseHead,
    reverse: Option<&ReverseMap<'_>>,
    framing: &ClientFraming,
    edits: Option<ResponseEdits<'_>>,
) {
    push_status_line(out, resp.status, &buf[resp.reason.clone()]);
    let coding = &framing.coding;
    match (edits, coding.drops_any()) {
        // Separate loops so that a route without rules runs exactly the copy it always ran.
        (None, false) => copy_headers(out, buf, resp, reverse, |_| false),
        (Some((rules, _)), false) => {
            copy_headers(out, buf, resp, reverse, |name| rules.drops(name))
        }
        (edits, true) => copy_headers(out, buf, resp, reverse, |name| {
            coding.drops(name) || edits.is_some_and(|(rules, _)| rules.drops(name))
        }),
    }
    if let Some((_, rendered)) = edits {
        out.extend_from_slice(rendered);
    }
    if *coding != Plan::default() {
        coding.push_lines(out, buf, &resp.headers);
    }
    let chunked = resp.framing == BodyFraming::Chunked && !framing.dechunk;
    if chunked || coding.encoding.is_some() {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if resp.status == 101 {
        out.extend_from_slice(b"Connection: upgrade\r\n");
        for h in resp
            .headers
            .iter()
            .filter(|h| h.kind == HeaderKind::Upgrade)
        {
            push_header(out, b"Upgrade", &buf[h.value.clone()]);
        }
    } else {
        Persistence::of(!framing.close, framing.http10).push_header(out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Copies the end-to-end header lines (mapping location headers back through `reverse`),
/// except those whose names are `dropped`.
#[inline]
fn copy_headers(
    out: &mut Vec<u8>,
    buf: &[u8],
    resp: &ResponseHead,
    reverse: Option<&ReverseMap<'_>>,
    dropped: impl Fn(&[u8]) -> bool,
) {
    let mut lines = HeaderLines::default();
    for h in &resp.headers {
        if h.connection_listed || h.kind.is_hop_by_hop() || dropped(&buf[h.name.clone()]) {
            continue;
        }
        let Some(map) = reverse.filter(|_| is_location(h.kind)) else {
            lines.keep(out, buf, h);
            continue;
        };
        lines.flush(out, buf);
        let value = &buf[h.value.clone()];
        out.extend_from_slice(&buf[h.name.clone()]);
        out.extend_from_slice(b": ");
        if !map.map_into(value, out) {
            out.extend_from_slice(value);
        }
        out.extend_from_slice(b"\r\n");
    }
    lines.flush(out, buf);
}

fn is_location(kind: HeaderKind) -> bool {
    matches!(
        kind,
        HeaderKind::Location | HeaderKind::ContentLocation | HeaderKind::Uri
    )
}
