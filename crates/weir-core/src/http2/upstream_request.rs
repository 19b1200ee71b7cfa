//! The request an HTTP/2 or HTTP/3 client's stream sends to an HTTP/2 upstream, made from the client's
//! own request instead of an HTTP/1.1 head written and parsed again (which cost a gRPC
//! call about 8k instructions and five allocations).
//!
//! The client's `HeaderMap` is moved: its values stay the `Bytes` the HPACK decoder made.
//! The fields `forward::request_head` does not copy are removed (`HeadNames`: hop-by-
//! hop, `Host`, the forwarded headers on a route that sets them, the request id, `set` and
//! `remove` rules, the client-certificate header), `te` stays when it is `trailers`. The
//! fields Weir adds are written by the same writer as for an HTTP/1.1 upstream
//! (`write_added_fields`), once, into one `Bytes` from the worker's arena that the new
//! values slice; the path (when normalised or rewritten) and the authority (when it is not
//! the client's) are written there too, so building the request allocates nothing of its
//! own. The method, the path, the authority (`Host` as `write_request_head` picks it) and
//! the fields are those the HTTP/1.1 head and `h1_head_to_h2` give, with one allowed
//! difference: split `cookie` fields stay split (RFC 9113 8.2.3; the head joins them).
//! A stream sent again after a refusal is built from the head (`h1_head_to_h2`): the
//! client's map went with the first one.

use std::ops::Range;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, SEC_WEBSOCKET_KEY, TE};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::Method;
use weir_config::{Route, UpstreamServer};

use super::names::added_name;
use super::scratch::Scratches;
use crate::codec::http1::header::trim;
use crate::codec::http1::{BodyFraming, RequestHead};
use crate::error::ProxyError;
use crate::filters::rewrite::upstream_path;
use crate::forward::h2::is_connection_specific;
use crate::forward::request_head::{write_added_fields, ClientFacts};
use crate::forward::trailer;
use crate::router::RoutedPath;

const BAD: ProxyError = ProxyError::BadRequest("request not expressible in HTTP/2");

/// What the upstream request is made of besides the client's own request.
pub(crate) struct Upstream<'a> {
    /// The client's request as an HTTP/1.1 head (`buf`, parsed into `req`).
    pub buf: &'a [u8],
    pub req: &'a RequestHead,
    /// The path as routed (normalised).
    pub path: &'a RoutedPath,
    pub route: &'a Route,
    pub server: &'a UpstreamServer,
    pub client: ClientFacts<'a>,
    pub scheme: Scheme,
    /// The client sent `te: trailers`.
    pub te_trailers: bool,
}

/// Where `render` wrote the values the request takes from Weir.
struct Written {
    path: Option<Range<usize>>,
    authority: Option<Range<usize>>,
    /// The request id's value.
    id: Option<Range<usize>>,
    /// The other added fields' lines, from here to the end.
    lines: usize,
}

/// The HTTP/2 request to the upstream for the client's request `parts`.
pub(crate) fn upstream_request(
    parts: Parts,
    u: &Upstream<'_>,
    scratch: &Scratches,
) -> Result<http::Request<()>, ProxyError> {
    let Parts {
        method,
        uri,
        mut headers,
        ..
    } = parts;
    remove_unforwarded(&mut headers, u);
    trim_values(&mut headers);
    // The head says `content-length: 0` for a POST, PUT or PATCH without DATA.
    let zero_length = [Method::POST, Method::PUT, Method::PATCH].contains(&method);
    if u.req.framing == BodyFraming::None && zero_length && !headers.contains_key(CONTENT_LENGTH) {
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    let routed = u.path.get(u.req.path(u.buf));
    let rewrite = u.route.rewrite_prefix.as_deref();
    let (prefix, rest) = upstream_path(routed, &u.route.path_prefix, rewrite);
    let client_path = uri
        .path_and_query()
        .filter(|p| prefix.is_empty() && p.as_str().as_bytes() == rest);
    let host = u.host();
    let client_authority = uri
        .authority()
        .filter(|a| host == Some(a.as_str().as_bytes()));
    let (edits, id_name) = (u.client.edits, u.client.names.request_id);
    let id = edits.and_then(|e| id_name.map(|name| (name, e.vars.request_id)));
    let (bytes, at) = scratch.render(|out| Written {
        path: client_path.is_none().then(|| append(out, &[prefix, rest])),
        authority: host
            .filter(|_| client_authority.is_none())
            .map(|h| append(out, &[h])),
        id: id.map(|(_, value)| append(out, &[value])),
        lines: {
            let lines = out.len();
            write_added_fields(out, u.buf, u.req, u.route, u.client);
            lines
        },
    });
    // The request id first, as the head has it; its value is new on every request.
    if let Some(((name, _), at)) = id.zip(at.id) {
        let name = added_name(name).map_err(|_| BAD)?;
        let mut value = HeaderValue::from_maybe_shared(bytes.slice(at)).map_err(|_| BAD)?;
        value.set_sensitive(true);
        headers.append(name, value);
    }
    let set_host = add_lines(&mut headers, &bytes, at.lines, id_name)?;
    let path = match (client_path, at.path) {
        (Some(p), _) => p.clone(),
        (None, Some(r)) => PathAndQuery::from_maybe_shared(bytes.slice(r)).map_err(|_| BAD)?,
        (None, None) => return Err(BAD),
    };
    let written = |value: Bytes| Authority::from_maybe_shared(value).map_err(|_| BAD);
    let authority = match (set_host, client_authority, at.authority) {
        (Some(value), _, _) => Some(written(value)?),
        (None, Some(a), _) => Some(a.clone()),
        (None, None, Some(r)) => Some(written(bytes.slice(r))?),
        (None, None, None) => None,
    };
    request(method, u.scheme.clone(), authority, path, headers)
}

/// An HTTP/1.1 request head (as Weir wrote it) as an HTTP/2 request: its fields as
/// [`add_lines`] takes Weir's own (`Host` the authority, the request id field, named
/// `unindexed`, never indexed), `te: trailers` put back when the client sent it.
pub(crate) fn h1_head_to_h2(
    head: &[u8],
    scheme: Scheme,
    te_trailers: bool,
    unindexed: Option<&[u8]>,
) -> Result<http::Request<()>, ProxyError> {
    // One copy that the values slice, without the blank line that ends the head.
    let head = Bytes::copy_from_slice(head.strip_suffix(b"\r\n").ok_or(BAD)?);
    let fields = head.iter().position(|b| *b == b'\n').ok_or(BAD)? + 1;
    let mut words = head[..fields].split(|b| *b == b' ');
    let (Some(method), Some(path)) = (words.next(), words.next()) else {
        return Err(BAD);
    };
    let method = Method::from_bytes(method).map_err(|_| BAD)?;
    let path = PathAndQuery::from_maybe_shared(head.slice_ref(path)).map_err(|_| BAD)?;
    let mut headers = HeaderMap::new();
    let host = add_lines(&mut headers, &head, fields, unindexed)?;
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    let authority = host.map(Authority::from_maybe_shared).transpose();
    request(method, scheme, authority.map_err(|_| BAD)?, path, headers)
}

/// The HTTP/2 request `method` to `scheme`, `authority` and `path`, with `headers`.
fn request(
    method: Method,
    scheme: Scheme,
    authority: Option<Authority>,
    path: PathAndQuery,
    headers: HeaderMap,
) -> Result<http::Request<()>, ProxyError> {
    let mut target = http::uri::Parts::default();
    target.scheme = Some(scheme);
    target.authority = authority;
    target.path_and_query = Some(path);
    let mut request = http::Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = http::Uri::from_parts(target).map_err(|_| BAD)?;
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = headers;
    Ok(request)
}

impl Upstream<'_> {
    /// The `Host` `write_request_head` writes: the client's (`preserve_host`) or the
    /// server's name; `None` when a `set` rule writes it.
    fn host(&self) -> Option<&[u8]> {
        if self.client.names.rules.is_some_and(|r| r.sets_host) {
            return None;
        }
        let client_host = self.req.host.as_ref().map(|r| &self.buf[r.clone()]);
        Some(match client_host.filter(|_| self.route.preserve_host) {
            Some(host) => host,
            None => self.server.name.as_bytes(),
        })
    }
}

/// Appends `pieces`; returns where they are.
#[inline]
pub(super) fn append(out: &mut Vec<u8>, pieces: &[&[u8]]) -> Range<usize> {
    let start = out.len();
    for p in pieces {
        out.extend_from_slice(p);
    }
    start..out.len()
}

/// Removes the client's fields the HTTP/1.1 head would not carry upstream. Usually none
/// is (a gRPC call's `te` stays), so the map is scanned once and left as it is.
fn remove_unforwarded(headers: &mut HeaderMap, u: &Upstream<'_>) {
    let names = u.client.names;
    let kept = |name: &HeaderName| {
        if name == TE {
            return u.te_trailers;
        }
        // Written by Weir for an extended CONNECT only.
        name != SEC_WEBSOCKET_KEY && names.forwards(name.as_str().as_bytes())
    };
    while let Some(name) = headers.keys().find(|n| !kept(n)).cloned() {
        headers.remove(&name);
    }
}

/// Trims leading and trailing SP / HTAB off values, as httparse does to the head's: the
/// `h2` crate lets such values through.
fn trim_values(headers: &mut HeaderMap) {
    let padded = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    for value in headers.values_mut() {
        let raw = value.as_bytes();
        if padded(raw.first()) || padded(raw.last()) {
            if let Ok(trimmed) = HeaderValue::from_bytes(trim(raw)) {
                *value = trimmed;
            }
        }
    }
}

/// Adds the `Name: value\r\n` lines of `bytes` from `start` on (as `write_added_fields`
/// wrote them) as fields whose values are slices of `bytes`, the one named `unindexed`
/// (the request id: a new value on every request) marked sensitive, so that the `h2`
/// crate's HPACK encoder sends it as a literal never indexed: indexed, each id was
/// inserted into the connection's 4 KiB dynamic table and evicted the entries that repeat
/// (gRPC calls spent about 4.7k instructions per call in that table's upkeep). Returns the
/// value of a `Host` line (from a `set` rule, or the head's): the authority, not a field.
fn add_lines(
    headers: &mut HeaderMap,
    bytes: &Bytes,
    start: usize,
    unindexed: Option<&[u8]>,
) -> Result<Option<Bytes>, ProxyError> {
    let mut host = None;
    for field in trailer::fields(&bytes[start..]) {
        let (_, raw_name, value) = field.ok_or(BAD)?;
        let value = bytes.slice_ref(value);
        if raw_name.eq_ignore_ascii_case(b"host") {
            host = Some(value);
            continue;
        }
        let name = added_name(raw_name).map_err(|_| BAD)?;
        if is_connection_specific(&name) {
            continue;
        }
        let mut value = HeaderValue::from_maybe_shared(value).map_err(|_| BAD)?;
        if unindexed.is_some_and(|u| u.eq_ignore_ascii_case(raw_name)) {
            value.set_sensitive(true);
        }
        headers.append(name, value);
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{fill_written, HeadLimits};
    use crate::filters::forwarded::ClientIp;
    use crate::filters::headers::Vars;
    use crate::forward::request_head::{write_request_head, HeadNames, RequestEdits};
    use crate::http2::request::write_head;

    const ID: &str = "X-Request-Id";

    /// A request as the upstream sees it: method, URI, and each field with its
    /// sensitivity, sorted, split `cookie` fields joined (as the HTTP/1.1 head joins them).
    fn seen(request: &http::Request<()>) -> String {
        let mut fields: Vec<String> = Vec::new();
        let cookies: Vec<&str> = (request.headers().get_all("cookie").iter())
            .filter_map(|v| v.to_str().ok())
            .collect();
        if !cookies.is_empty() {
            fields.push(format!("cookie: {} false", cookies.join("; ")));
        }
        for (name, value) in request.headers() {
            if name != "cookie" {
                let sensitive = value.is_sensitive();
                let value = String::from_utf8_lossy(value.as_bytes());
                fields.push(format!("{name}: {value:?} {sensitive}"));
            }
        }
        fields.sort();
        let line = (request.method(), request.uri(), request.version());
        format!("{line:?}\n{}", fields.join("\n"))
    }

    /// The upstream request for `client` on a route with `route_keys`, built from the
    /// client's request and from the HTTP/1.1 head: `[direct, via the head]`.
    fn both(route_keys: &str, client: http::Request<()>, eos: bool) -> [String; 2] {
        let text = format!(
            "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n\
             [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n{route_keys}\n\
             [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:9\" }}]\nprotocol = \"h2c\"\n"
        );
        let config = weir_config::parse_str(&text, "t").expect("valid config");
        let listener = &config.listeners[0];
        let (route, server) = (&listener.routes[0], &config.upstreams[0].servers[0]);
        let (parts, ()) = client.into_parts();
        let (mut buf, mut req) = (Vec::new(), RequestHead::default());
        let line = write_head(&mut buf, &mut req.headers, &parts, eos).expect("h2 request");
        let limits = HeadLimits {
            max_header_size: 64 * 1024,
            max_headers: 64,
        };
        fill_written(&buf, line.method, line.target, limits, &mut req).expect("filled");
        let mut path = RoutedPath::default();
        let raw = req.path(&buf);
        path.normalize(raw, &listener.path_normalization)
            .expect("normalised");
        let te_trailers = super::super::upstream::H2Facts::of(&parts.headers).te_trailers;
        let (ip, real) = (
            ClientIp::new([10, 0, 0, 1].into()),
            ClientIp::new([9, 9, 9, 9].into()),
        );
        let vars = Vars {
            scheme: b"http",
            host: req.host.as_ref().map_or(&[][..], |r| &buf[r.clone()]),
            target: req.path(&buf),
            client_ip: real.as_bytes(),
            request_id: b"id-1",
        };
        let edits = RequestEdits {
            real_client: Some(&real),
            vars,
            trace: None,
        };
        let names = HeadNames {
            forwarded: route.forwarded_headers,
            cert_header: None,
            request_id: Some(ID.as_bytes()),
            rules: route.filters.request_headers.as_ref(),
            traced: false,
        };
        let client = ClientFacts {
            ip: &ip,
            tls: None,
            names,
            edits: Some(&edits),
        };
        let mut head = Vec::new();
        write_request_head(&mut head, &buf, &req, &path, route, server, client);
        let via_head =
            h1_head_to_h2(&head, Scheme::HTTP, te_trailers, Some(ID.as_bytes())).expect("via head");
        let u = Upstream {
            buf: &buf,
            req: &req,
            path: &path,
            route,
            server,
            client,
            scheme: Scheme::HTTP,
            te_trailers,
        };
        let direct = upstream_request(parts, &u, &Scratches::default()).expect("direct");
        [seen(&direct), seen(&via_head)]
    }

    #[test]
    fn a_grpc_call_is_the_request_the_http1_head_gives() {
        let call = http::Request::post("http://example.test/bench.Echo/Unary")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", "h2load")
            .header("content-length", "21")
            .body(())
            .expect("a valid test request");
        let [direct, via_head] = both("path_prefix = \"/\"", call, false);
        assert_eq!(direct, via_head);
        assert!(direct.contains("te: \"trailers\" false"), "{direct}");
        assert!(direct.contains("x-request-id: \"id-1\" true"), "{direct}");
    }

    #[test]
    fn every_edit_gives_the_request_the_http1_head_gives() {
        let client = || {
            http::Request::get("http://public.test:8443/api/./v1/../items?q=1")
                .header("cookie", "a=1")
                .header("x-forwarded-for", "1.1.1.1")
                .header("x-forwarded-for", "2.2.2.2")
                .header("x-real-ip", "6.6.6.6")
                .header("host", "other.test")
                .header("x-request-id", "client-id")
                .header("x-debug", "1")
                .header("x-env", "test")
                .header("x-padded", " padded\t ")
                .header("trailer", "x-t")
                .header("cookie", "b=2")
                .header("accept", "*/*")
        };
        let routes = [
            "path_prefix = \"/api\"\nrewrite_prefix = \"/internal\"\npreserve_host = false",
            "path_prefix = \"/\"\nforwarded_headers = false",
            "path_prefix = \"/\"\nrequest_headers = { set = { \"Host\" = \"{host}.in\", \
             \"X-Env\" = \"prod {client_ip}\" }, add = { \"X-Via\" = \"weir {request_id}\" }, \
             remove = [\"X-Debug\"] }",
        ];
        for keys in routes {
            let request = client().body(()).expect("a valid test request");
            let [direct, via_head] = both(keys, request, true);
            assert_eq!(direct, via_head, "{keys}");
            assert!(!direct.contains("trailer"), "{direct}");
        }
        let request = client().body(()).expect("a valid test request");
        let [direct, _] = both(routes[0], request, true);
        assert!(
            direct.contains("http://127.0.0.1:9/internal/items?q=1"),
            "{direct}"
        );
        assert!(direct.contains("x-forwarded-for: \"1.1.1.1, 2.2.2.2, 10.0.0.1\""));
    }

    #[test]
    fn a_post_without_data_gets_a_zero_content_length_as_through_the_head() {
        for (method, length) in [(http::Method::POST, true), (http::Method::GET, false)] {
            let request = http::Request::builder()
                .method(method)
                .uri("http://e.test/")
                .body(())
                .expect("a valid test request");
            let [direct, via_head] = both("path_prefix = \"/\"", request, true);
            assert_eq!(direct, via_head);
            assert_eq!(direct.contains("content-length: \"0\""), length, "{direct}");
        }
    }

    #[test]
    fn h1_head_becomes_h2_fields_without_connection_specific_ones() {
        let head = b"POST /a/b?c=d HTTP/1.1\r\nHost: up.test:8080\r\nConnection: keep-alive\r\n\
            Keep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nUpgrade: x\r\nTE: trailers\r\n\
            Content-Type: application/grpc\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n";
        let request = h1_head_to_h2(head, Scheme::HTTP, true, None).expect("translated");
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri().to_string(), "http://up.test:8080/a/b?c=d");
        let names: Vec<&str> = request.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-forwarded-for", "te"]);
        assert_eq!(request.headers()["te"], "trailers");
        let without_te = h1_head_to_h2(head, Scheme::HTTPS, false, None).expect("translated");
        assert!(without_te.headers().get("te").is_none());
        assert_eq!(without_te.uri().scheme_str(), Some("https"));
    }

    #[test]
    fn request_id_is_marked_never_indexed_and_nothing_else() {
        let head = b"GET / HTTP/1.1\r\nHost: up.test\r\nX-Request-Id: 4f1c-0001\r\n\
            X-Trace: a\r\n\r\n";
        let request = h1_head_to_h2(head, Scheme::HTTP, false, Some(b"x-request-ID")).expect("h2");
        assert!(request.headers()["x-request-id"].is_sensitive());
        assert_eq!(request.headers()["x-request-id"], "4f1c-0001");
        assert!(!request.headers()["x-trace"].is_sensitive());
        let off = h1_head_to_h2(head, Scheme::HTTP, false, None).expect("h2");
        assert!(!off.headers()["x-request-id"].is_sensitive());
    }
}
