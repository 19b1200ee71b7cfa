//! Writing the upstream request head: request line (the normalised path the request was
//! routed on, with the route's prefix rewrite), end-to-end headers byte for byte, `Host`,
//! framing, and the forwarded headers.

use weir_config::{Route, UpstreamServer};

use crate::codec::http1::write::{push_header, HeaderLines};
use crate::codec::http1::{BodyFraming, HeaderKind, RequestHead};
use crate::filters::forwarded::{push_forwarded, ClientIp};
use crate::filters::rewrite::upstream_path;
use crate::filters::upgrade::{push_offer, Offered};
use crate::router::RoutedPath;
use crate::tls::session::TlsSession;

/// What the upstream request head says about the client.
#[derive(Clone, Copy)]
pub struct ClientFacts<'a> {
    /// The client address (`X-Forwarded-For`, `X-Real-IP`).
    pub ip: &'a ClientIp,
    /// The connection's TLS session (`X-Forwarded-Proto: https`, the client-certificate
    /// header).
    pub tls: Option<&'a TlsSession>,
}

/// Appends the upstream request head for `req` (parsed from `buf`, its path normalised
/// into `path`) to `out`. Returns the upgrade protocols it offers (empty: not an upgrade
/// request).
pub fn write_request_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    req: &RequestHead,
    path: &RoutedPath,
    route: &Route,
    server: &UpstreamServer,
    client: ClientFacts<'_>,
) -> Offered {
    let tls = client.tls;
    let (prefix, rest) = upstream_path(
        path.get(req.path(buf)),
        &route.path_prefix,
        route.rewrite_prefix.as_deref(),
    );
    out.extend_from_slice(&buf[req.method.clone()]);
    out.push(b' ');
    out.extend_from_slice(prefix);
    out.extend_from_slice(rest);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let client_host = req.host.as_ref().map(|r| &buf[r.clone()]);
    match client_host.filter(|_| route.preserve_host) {
        Some(host) => push_header(out, b"Host", host),
        None => push_header(out, b"Host", server.name.as_bytes()),
    }
    let mut lines = HeaderLines::default();
    // The client-certificate header is Weir's to set: a client's copy never passes.
    let strip = tls.and_then(|t| t.strip_header.as_deref());
    for h in &req.headers {
        if forwards_unchanged(h.kind, h.connection_listed, route.forwarded_headers)
            && !strip.is_some_and(|name| buf[h.name.clone()].eq_ignore_ascii_case(name))
        {
            lines.keep(out, buf, h);
        }
    }
    lines.flush(out, buf);
    if let Some(line) = tls.and_then(|t| t.cert_header_line.as_deref()) {
        out.extend_from_slice(line);
    }
    if req.framing == BodyFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    let offered = push_offer(out, buf, req, &route.upgrades);
    if route.forwarded_headers {
        let prior = req
            .headers
            .iter()
            .filter(|h| h.kind == HeaderKind::XForwardedFor)
            .map(|h| &buf[h.value.clone()]);
        push_forwarded(out, client.ip, client_host, prior, tls.is_some());
    }
    out.extend_from_slice(b"\r\n");
    offered
}

/// Headers copied as they are: everything end-to-end that the proxy does not set itself.
fn forwards_unchanged(kind: HeaderKind, connection_listed: bool, forwarded: bool) -> bool {
    if connection_listed || kind.is_hop_by_hop() || kind == HeaderKind::Host {
        return false;
    }
    let set_by_proxy = matches!(
        kind,
        HeaderKind::XForwardedFor
            | HeaderKind::XRealIp
            | HeaderKind::XForwardedProto
            | HeaderKind::XForwardedHost
    );
    !(forwarded && set_by_proxy)
}
