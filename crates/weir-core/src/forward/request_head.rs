//! Writing the upstream request head: request line (the normalised path the request was
//! routed on, with the route's prefix rewrite), end-to-end headers byte for byte, `Host`,
//! framing, and the forwarded headers.

use weir_config::{HeaderRules, Route, UpstreamServer};

use super::Target;
use crate::otel::RequestTrace;
use crate::request::Request;

use crate::codec::http1::write::{push_header, HeaderLines};
use crate::codec::http1::HeaderSpan;
use crate::codec::http1::{BodyFraming, HeaderKind, RequestHead};
use crate::filters::forwarded::{push_forwarded, ClientIp};
use crate::filters::headers::{push_rules, Vars};
use crate::filters::rewrite::upstream_path;
use crate::filters::upgrade::{push_offer, Offered};
use crate::router::RoutedPath;
use crate::tls::session::TlsSession;

/// What the upstream head says about the downstream side of the request.
#[derive(Clone, Copy)]
pub struct ClientFacts<'a> {
    /// The peer address (`X-Forwarded-For`; `X-Real-IP` unless `edits` names the client
    /// behind trusted proxies).
    pub ip: &'a ClientIp,
    /// The connection's TLS session (`X-Forwarded-Proto: https`, the client-certificate
    /// header).
    pub tls: Option<&'a TlsSession>,
    /// The client fields the head does not copy as they came.
    pub names: HeadNames<'a>,
    /// What the route's traffic policy changes (the values of what `names` says Weir
    /// writes); `None` when nothing.
    pub edits: Option<&'a RequestEdits<'a>>,
}

/// What the route's traffic policy changes in the upstream head; `None` when nothing.
pub struct RequestEdits<'a> {
    /// The client behind trusted proxies (`X-Real-IP`), when it is not the peer.
    pub real_client: Option<&'a ClientIp>,
    /// The `request_headers` rules' variables, and the request id.
    pub vars: Vars<'a>,
    /// The request's trace, when sampled: Weir's `traceparent` and `tracestate` replace
    /// the client's.
    pub trace: Option<&'a RequestTrace>,
}

/// `traceparent` or `tracestate`, in any case.
fn is_trace_context(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"traceparent") || name.eq_ignore_ascii_case(b"tracestate")
}

/// Which client fields, by name alone, the upstream head copies as they came: not
/// hop-by-hop, not `Host`, not one Weir writes itself or the route removes (the forwarded
/// headers on a route that sets them, the listener's client-certificate header, the
/// request id, the names of the route's `request_headers` `set` and `remove` rules, a
/// sampled request's trace context). The head's writer asks the same of each field it
/// copies (with the fields its `Connection` lists); the fields a client sends beside
/// its head ask it here: an HTTP/2 or HTTP/3 request's own fields
/// (`http2::upstream_request`), and every request's trailer fields (`forward::trailer`),
/// which an upstream may merge into the head.
#[derive(Clone, Copy)]
pub struct HeadNames<'a> {
    /// The route's `forwarded_headers`.
    pub forwarded: bool,
    /// The listener's `client_cert_header`: the client's copies are removed on every
    /// connection of the listener, TLS or plain (`http_bind`), in any case or spelling.
    pub cert_header: Option<&'a [u8]>,
    /// The listener's request-id header name, when ids are on.
    pub request_id: Option<&'a [u8]>,
    /// The route's `request_headers`.
    pub rules: Option<&'a HeaderRules>,
    /// The request is sampled: Weir writes its `traceparent` and `tracestate`.
    pub traced: bool,
}

impl<'a> HeadNames<'a> {
    /// The names for a request on `target` (`traced`: it has a sampled trace).
    #[inline]
    pub fn of(target: &Target<'a>, traced: bool) -> Self {
        let tls = target.listener.tls.as_ref();
        let id = target.listener.policy.request_id.as_ref();
        HeadNames {
            forwarded: target.route.forwarded_headers,
            cert_header: tls.and_then(|t| t.client_cert_header.as_deref().map(str::as_bytes)),
            request_id: id.map(|id| id.header.as_bytes()),
            rules: target.route.filters.request_headers.as_ref(),
            traced,
        }
    }

    /// Whether the head copies a client field named `name` (any case) as it came.
    #[inline]
    pub fn forwards(&self, name: &[u8]) -> bool {
        forwards_unchanged(HeaderKind::of(name), name, false, self.forwarded)
            && !self.strips(name)
            && !self.written_by_weir(name)
    }

    /// Whether `name` is the client-certificate header, Weir's to set: a client's copy
    /// never passes.
    #[inline]
    fn strips(&self, name: &[u8]) -> bool {
        self.cert_header.is_some_and(|s| same_header_name(name, s))
    }

    /// Whether a client field named `name` is left out because Weir writes its own or
    /// the route removes it: the request id (in either spelling: `X_Request_Id` too, as
    /// the forwarded headers), the names of the route's `set` and `remove` rules, and the
    /// trace context of a traced request.
    #[inline]
    fn written_by_weir(&self, name: &[u8]) -> bool {
        self.request_id.is_some_and(|id| same_header_name(name, id))
            || self.rules.is_some_and(|r| r.drops(name))
            || (self.traced && is_trace_context(name))
    }
}

/// Appends the upstream HTTP/1.1 head of `r` for `server` (`path`: its path as routed),
/// with the route's `request_headers` rules, the request id and the client behind trusted
/// proxies: every cell's upstream request says this (an HTTP/2 upstream's as fields).
/// Returns the upgrade protocols it offers.
pub fn write_upstream_head(
    out: &mut Vec<u8>,
    r: &Request<'_>,
    path: &RoutedPath,
    target: &Target<'_>,
    server: &UpstreamServer,
) -> Offered {
    with_client_facts(r, path, target, |client| {
        write_request_head(out, r.buf, r.req, path, target.route, server, client)
    })
}

/// Runs `f` with what the upstream request says about `r`'s client and the route's edits
/// (`path`: its routed path, for the rules' variables).
pub fn with_client_facts<T>(
    r: &Request<'_>,
    path: &RoutedPath,
    target: &Target<'_>,
    f: impl FnOnce(ClientFacts<'_>) -> T,
) -> T {
    // The names the head leaves out are the ones `HeadNames` says, whatever asks.
    let names = HeadNames::of(target, r.trace.is_some());
    let real_client = r.origin.behind.map(|(_, text)| text);
    let facts = ClientFacts {
        ip: r.origin.peer,
        tls: r.origin.tls,
        names,
        edits: None,
    };
    let (rules, id) = (names.rules, names.request_id);
    if rules.is_none() && id.is_none() && real_client.is_none() && r.trace.is_none() {
        return f(facts);
    }
    // The rules' `{variable}`s need the whole set; the request id alone, only itself.
    let vars = match rules {
        Some(_) => r.vars(path),
        None => Vars {
            request_id: r.origin.request_id,
            ..Vars::default()
        },
    };
    let edits = RequestEdits {
        real_client,
        vars,
        trace: r.trace,
    };
    f(ClientFacts {
        edits: Some(&edits),
        ..facts
    })
}

/// Renders the route's `response_headers` lines for `r` into `out` (emptied first), while
/// the request's head is at hand: its variables come from the request (`path`: its routed
/// path).
pub fn render_response_rules(out: &mut Vec<u8>, r: &Request<'_>, path: &RoutedPath, route: &Route) {
    if let Some(rules) = &route.filters.response_headers {
        out.clear();
        push_rules(out, rules, &r.vars(path));
    }
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
    let (edits, names) = (client.edits, &client.names);
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
        _ if names.rules.is_some_and(|r| r.sets_host) => {}
        Some(host) => push_header(out, b"Host", host),
        None => push_header(out, b"Host", server.name.as_bytes()),
    }
    // `names` says what `edits` writes: no edits, nothing of the client's to replace.
    debug_assert!(
        edits.is_some() || (names.rules.is_none() && names.request_id.is_none() && !names.traced),
        "ClientFacts with names Weir writes but no edits"
    );
    match edits {
        // Two loops so that a request without edits runs exactly the copy it always ran.
        Some(e) => {
            copy_headers(out, buf, &req.headers, route, |name| {
                names.strips(name) || names.written_by_weir(name)
            });
            if let Some(name) = names.request_id {
                push_header(out, name, e.vars.request_id);
            }
        }
        None => copy_headers(out, buf, &req.headers, route, |name| names.strips(name)),
    }
    push_added(out, &client);
    if req.framing == BodyFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    let offered = push_offer(out, buf, req, &route.upgrades);
    if route.forwarded_headers {
        push_client_forwarded(out, buf, req, client_host, client);
    }
    out.extend_from_slice(b"\r\n");
    offered
}

/// The forwarded headers for `req` (its own `X-Forwarded-For` values continued).
fn push_client_forwarded(
    out: &mut Vec<u8>,
    buf: &[u8],
    req: &RequestHead,
    client_host: Option<&[u8]>,
    client: ClientFacts<'_>,
) {
    let prior = req
        .headers
        .iter()
        .filter(|h| h.kind == HeaderKind::XForwardedFor)
        .map(|h| &buf[h.value.clone()]);
    let real = client
        .edits
        .and_then(|e| e.real_client)
        .unwrap_or(client.ip);
    push_forwarded(
        out,
        real,
        client.ip,
        client_host,
        prior,
        client.tls.is_some(),
    );
}

/// Appends, as `write_request_head` writes them, the lines Weir adds to a request (the
/// route's `request_headers`, a sampled request's trace context, the client-certificate
/// header, the forwarded headers; the request id aside) and nothing else: the fields an HTTP/2 upstream's request gets on top
/// of the client's own and the id (`http2::upstream_request`). A `Host` line among them
/// comes from a `set` rule.
pub fn write_added_fields(
    out: &mut Vec<u8>,
    buf: &[u8],
    req: &RequestHead,
    route: &Route,
    client: ClientFacts<'_>,
) {
    push_added(out, &client);
    if route.forwarded_headers {
        let client_host = req.host.as_ref().map(|r| &buf[r.clone()]);
        push_client_forwarded(out, buf, req, client_host, client);
    }
}

/// Appends the lines Weir adds after the client's own (the request id's aside): the
/// route's `request_headers`, a sampled request's trace context, the client-certificate
/// header.
fn push_added(out: &mut Vec<u8>, client: &ClientFacts<'_>) {
    if let Some(e) = client.edits {
        if let Some(rules) = client.names.rules {
            push_rules(out, rules, &e.vars);
        }
        if let Some(trace) = e.trace {
            trace.push_headers(out);
        }
    }
    if let Some(line) = client.tls.and_then(|t| t.cert_header_line.as_deref()) {
        out.extend_from_slice(line);
    }
}

/// Copies the lines of the headers forwarded as they are, except those `dropped` names.
#[inline]
fn copy_headers(
    out: &mut Vec<u8>,
    buf: &[u8],
    headers: &[HeaderSpan],
    route: &Route,
    dropped: impl Fn(&[u8]) -> bool,
) {
    let mut lines = HeaderLines::default();
    for h in headers {
        let name = &buf[h.name.clone()];
        if forwards_unchanged(h.kind, name, h.connection_listed, route.forwarded_headers)
            && !dropped(name)
        {
            lines.keep(out, buf, h);
        }
    }
    lines.flush(out, buf);
}

/// Whether `name` is `header` in any case, with `_` taken for `-`: CGI-style servers (PHP,
/// WSGI) read `X_Client_Cert` as `X-Client-Cert`, so a header Weir owns is refused in
/// either spelling (nginx drops underscore names for the same reason).
pub(crate) fn same_header_name(name: &[u8], header: &[u8]) -> bool {
    let fold = |b: &u8| weir_config::fold_name_byte(*b);
    name.len() == header.len() && name.iter().map(fold).eq(header.iter().map(fold))
}

/// Headers copied as they are: everything end-to-end (not `listed` in `Connection`) that
/// the proxy does not set itself (`name`'s `kind`; on a route that sets the forwarded
/// headers, in either spelling).
fn forwards_unchanged(kind: HeaderKind, name: &[u8], listed: bool, forwarded: bool) -> bool {
    if listed || kind.is_hop_by_hop() || kind == HeaderKind::Host {
        return false;
    }
    let set_by_proxy = match kind {
        HeaderKind::XForwardedFor
        | HeaderKind::XRealIp
        | HeaderKind::XForwardedProto
        | HeaderKind::XForwardedHost => true,
        HeaderKind::Other => forwarded && forwarded_in_cgi_spelling(name),
        _ => false,
    };
    !(forwarded && set_by_proxy)
}

/// Whether `name` is one of the forwarded headers Weir sets, spelt with `_` for `-`
/// (`X_Real_IP`): a CGI-style server reads it as the real one, and a client's copy would
/// come first. The length is checked first: every other name pays one comparison.
fn forwarded_in_cgi_spelling(name: &[u8]) -> bool {
    const SET: [&[u8]; 4] = [
        b"x-real-ip",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
    ];
    matches!(name.len(), 9 | 15..=17) && SET.iter().any(|h| same_header_name(name, h))
}

#[cfg(test)]
mod tests {
    use super::HeadNames;

    #[test]
    fn head_names_leave_out_what_weir_writes_in_any_spelling() {
        let names = HeadNames {
            forwarded: true,
            cert_header: Some(b"X-Client-Cert"),
            request_id: Some(b"X-Request-Id"),
            rules: None,
            traced: true,
        };
        for gone in [
            "X-Forwarded-For",
            "x_real_ip",
            "X-Forwarded-Proto",
            "x-forwarded-host",
            "X-Client-Cert",
            "x_client_cert",
            "x-request-id",
            "TraceParent",
            "tracestate",
            "Host",
            "Connection",
            "Transfer-Encoding",
        ] {
            assert!(!names.forwards(gone.as_bytes()), "{gone}");
        }
        for kept in ["X-Sum", "Forwarded", "X-Client-Certs"] {
            assert!(names.forwards(kept.as_bytes()), "{kept}");
        }
        // What Weir does not write passes as it came.
        let plain = HeadNames {
            forwarded: false,
            cert_header: None,
            request_id: None,
            rules: None,
            traced: false,
        };
        for kept in [
            "X-Forwarded-For",
            "X-Client-Cert",
            "X-Request-Id",
            "traceparent",
        ] {
            assert!(plain.forwards(kept.as_bytes()), "{kept}");
        }
    }
}
