//! An HTTP/2 echo backend on the `h2` crate's server, h2c (prior knowledge) or h2 over
//! TLS, on its own thread and runtime, stopped when dropped.
//!
//! Each request gets 200 with `x-method`, `x-path`, `x-authority`, `x-te` (when sent),
//! `x-conn` (the connection's number, from 1), `x-fields` (the request's field names, comma
//! separated) and the request's `content-type`; its DATA
//! is echoed as it arrives; then trailers: `x-body-len`, `x-client-trailer` (the request
//! trailer of that name, when sent), `grpc-status: 0` (the request's `x-grpc-status`
//! instead, when it has one), on a path starting with `/trailer-fields` `x-trailer-fields`
//! (the names of the request's trailer fields, sorted, comma separated) (and, on
//! `/bad-trailers`, the
//! fields of [`FORBIDDEN_TRAILERS`]). A path starting with `/hang` is
//! never answered (a reset of it is counted, [`H2Backend::resets`]); one starting with `/reset` is reset (INTERNAL_ERROR) before any head. With [`H2Backend::goaway_after`] each connection sends GOAWAY once it
//! has accepted that many streams (and finishes them), and refuses any stream that still
//! arrives with REFUSED_STREAM (as a server that never processed it).
//!
//! For HTTP/1.1 clients translated to HTTP/2: `/fixed` answers `content-length: 5` and
//! `hello` (no trailers); `/show-fields` answers the request's fields as its body (sorted
//! `name: value` lines, split cookies joined), without trailers; `/badlen` says
//! `content-length: 10` and sends 5 bytes; `/hints` sends a 103 (`link: </a.css>`) before
//! the echo (`n` of them with `?n=N`, the i-th with `x-hint: i`; a `100` first on
//! `/hints-100`, a `101` (malformed in HTTP/2) on `/hints-101`; on `/hints-hang` no final head follows them, as on `/hang`); a HEAD request
//! gets its head only, with
//! `content-length: 42`. `/quote-name-head` adds a field named `x"y` to the echo's head,
//! `/quote-name-trailer` to its trailers (a name HTTP/2 carries but HTTP/1.1 does not). `/grpc.health.v1.Health/Check` is a gRPC health service
//! ([`H2Backend::set_serving`]).
//!
//! [`H2Backend::early_once`]: the backend's first stream is refused (REFUSED_STREAM) or
//! answered with a status at its HEADERS, before any of its body is read; later streams
//! as above.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::server_thread::ServerThread;
use crate::TlsServer;

/// The answer of a [`H2Backend::fixed`] backend.
struct Fixed {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
}

#[derive(Default)]
struct Stats {
    fixed: std::sync::Mutex<Option<Arc<Fixed>>>,
    connections: AtomicUsize,
    streams: AtomicUsize,
    resets: AtomicUsize,
    health_checks: AtomicUsize,
    not_serving: AtomicBool,
    empty_data: AtomicUsize,
    /// How the next stream is answered at its HEADERS (0: echoed; [`REFUSE`]: refused).
    early: AtomicU16,
}

/// [`H2Backend::early_once`]'s answer that refuses the stream (REFUSED_STREAM).
pub const REFUSE: u16 = 1;

/// A running HTTP/2 echo backend.
pub struct H2Backend {
    server: ServerThread,
    stats: Arc<Stats>,
}

impl H2Backend {
    /// Cleartext HTTP/2 with prior knowledge.
    pub fn h2c() -> H2Backend {
        H2Backend::spawn(None, None)
    }

    /// h2c; every request gets `status`, `headers` and `body` (with its `content-length`),
    /// as [`crate::Backend::fixed`] answers over HTTP/1.1 (its request body read first).
    pub fn fixed(status: u16, headers: &[(&str, &str)], body: &str) -> H2Backend {
        let backend = H2Backend::spawn(None, None);
        let headers = headers
            .iter()
            .map(|(n, v)| (n.to_lowercase(), v.to_string()));
        *backend.stats.fixed.lock().unwrap() = Some(Arc::new(Fixed {
            status,
            headers: headers.collect(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }));
        backend
    }

    /// h2c whose first stream gets `early` at its HEADERS, its body unread: a status
    /// (`503`), or [`REFUSE`] (REFUSED_STREAM); every later stream the echo.
    pub fn early_once(early: u16) -> H2Backend {
        let backend = H2Backend::spawn(None, None);
        backend.stats.early.store(early, Ordering::SeqCst);
        backend
    }

    /// h2c, each connection sending GOAWAY after accepting `streams` streams.
    pub fn goaway_after(streams: usize) -> H2Backend {
        H2Backend::spawn(None, Some(streams))
    }

    /// HTTP/2 over TLS (`tls` from [`TlsServer::h2`]).
    pub fn tls(tls: &TlsServer) -> H2Backend {
        H2Backend::spawn(Some(tls.acceptor()), None)
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// `/hang` streams the client reset so far.
    pub fn resets(&self) -> usize {
        self.stats.resets.load(Ordering::SeqCst)
    }

    /// Streams (requests) accepted so far.
    pub fn streams(&self) -> usize {
        self.stats.streams.load(Ordering::SeqCst)
    }

    /// Empty DATA frames received (a bare END_STREAM): a proxy that ends a body this way
    /// costs the server one frame per request.
    pub fn empty_data_frames(&self) -> usize {
        self.stats.empty_data.load(Ordering::SeqCst)
    }

    /// `grpc.health.v1.Health/Check` calls answered so far.
    pub fn health_checks(&self) -> usize {
        self.stats.health_checks.load(Ordering::SeqCst)
    }

    /// What the gRPC health service answers from now on: SERVING or NOT_SERVING.
    pub fn set_serving(&self, serving: bool) {
        self.stats.not_serving.store(!serving, Ordering::SeqCst);
    }

    fn spawn(tls: Option<TlsAcceptor>, goaway: Option<usize>) -> H2Backend {
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let server =
            ServerThread::spawn(move |listener| accept_loop(listener, tls, goaway, thread_stats));
        H2Backend { server, stats }
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    goaway: Option<usize>,
    stats: Arc<Stats>,
) {
    while let Ok((tcp, _)) = listener.accept().await {
        let number = stats.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let stats = stats.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve(tcp, number, goaway, stats).await,
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        serve(stream, number, goaway, stats).await;
                    }
                }
            }
        });
    }
}

/// Serves one connection's streams.
async fn serve<T>(io: T, number: usize, goaway: Option<usize>, stats: Arc<Stats>)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    let mut accepted = 0;
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        if goaway.is_some_and(|n| accepted >= n) {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        }
        stats.streams.fetch_add(1, Ordering::SeqCst);
        accepted += 1;
        tokio::spawn(echo(request, respond, number, stats.clone()));
        if goaway == Some(accepted) {
            conn.graceful_shutdown();
        }
    }
}

/// The 1xx heads of a `/hints` path (see the module doc).
fn send_hints(respond: &mut SendResponse<Bytes>, path: &str) {
    for (prefix, status) in [("/hints-100", 100), ("/hints-101", 101)] {
        if path.starts_with(prefix) {
            let first = Response::builder().status(status).body(());
            let _ = respond.send_informational(first.expect("testkit: 1xx"));
        }
    }
    let n = path
        .split_once("n=")
        .and_then(|(_, n)| n.split('&').next()?.parse().ok())
        .unwrap_or(1);
    for i in 0..n {
        let hints = Response::builder()
            .status(103)
            .header("link", "</a.css>")
            .header("x-hint", i.to_string())
            .body(());
        let _ = respond.send_informational(hints.expect("testkit: 103"));
    }
}

/// Reads the request's body, then sends the fixed answer.
async fn answer_fixed(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    fixed: &Fixed,
) {
    let mut body = request.into_body();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
    }
    let mut head = Response::builder().status(fixed.status);
    for (name, value) in &fixed.headers {
        head = head.header(name, value);
    }
    let head = head.header("content-length", fixed.body.len());
    let Ok(head) = head.body(()) else { return };
    let empty = fixed.body.is_empty();
    let Ok(mut send) = respond.send_response(head, empty) else {
        return;
    };
    if !empty {
        let _ = send.send_data(fixed.body.clone(), true);
    }
}

async fn echo(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    number: usize,
    stats: Arc<Stats>,
) {
    match stats.early.swap(0, Ordering::SeqCst) {
        0 => {}
        REFUSE => return respond.send_reset(h2::Reason::REFUSED_STREAM),
        status => {
            let head = Response::builder().status(status).body(());
            let _ = respond.send_response(head.expect("testkit: early head"), true);
            return;
        }
    }
    let fixed = stats.fixed.lock().unwrap().clone();
    if let Some(fixed) = fixed {
        return answer_fixed(request, respond, &fixed).await;
    }
    let (parts, mut body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let bad_trailers = path.starts_with("/bad-trailers");
    let grpc_status = parts
        .headers
        .get("x-grpc-status")
        .cloned()
        .unwrap_or(HeaderValue::from_static("0"));
    if path.starts_with("/hints") {
        send_hints(&mut respond, path);
    }
    if path.starts_with("/hang") || path.starts_with("/hints-hang") {
        if std::future::poll_fn(|cx| respond.poll_reset(cx))
            .await
            .is_ok()
        {
            stats.resets.fetch_add(1, Ordering::SeqCst);
        }
        return;
    }
    if path.starts_with("/reset") {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return;
    }
    if path == "/grpc.health.v1.Health/Check" {
        stats.health_checks.fetch_add(1, Ordering::SeqCst);
        let serving = !stats.not_serving.load(Ordering::SeqCst);
        return grpc_health(body, respond, serving).await;
    }
    if path.starts_with("/fixed") || path.starts_with("/badlen") {
        let (len, body) = if path.starts_with("/fixed") {
            ("5", "hello")
        } else {
            ("10", "short")
        };
        let response = Response::builder().header("content-length", len).body(());
        if let Ok(mut send) = respond.send_response(response.expect("testkit: head"), false) {
            let _ = send.send_data(Bytes::from_static(body.as_bytes()), true);
        }
        return;
    }
    if parts.method == http::Method::HEAD {
        let response = Response::builder().header("content-length", "42").body(());
        let _ = respond.send_response(response.expect("testkit: head"), true);
        return;
    }
    let mut response = Response::new(());
    let headers = response.headers_mut();
    let mut put = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    };
    put("x-method", parts.method.as_str());
    put("x-path", path);
    put(
        "x-authority",
        parts.uri.authority().map_or("", |a| a.as_str()),
    );
    put("x-conn", &number.to_string());
    if let Some(te) = parts.headers.get("te").and_then(|v| v.to_str().ok()) {
        put("x-te", te);
    }
    let names: Vec<&str> = parts.headers.keys().map(|n| n.as_str()).collect();
    put("x-fields", &names.join(","));
    if let Some(ct) = parts.headers.get("content-type") {
        headers.insert("content-type", ct.clone());
    }
    if path.starts_with("/quote-name-head") {
        headers.insert(quote_name(), HeaderValue::from_static("1"));
    }
    let Ok(mut send) = respond.send_response(response, false) else {
        return;
    };
    if path.starts_with("/show-fields") {
        let shown = show_fields(&parts.headers);
        send.reserve_capacity(shown.len());
        let _ = send.send_data(shown.into(), true);
        return;
    }
    let mut len = 0usize;
    while let Some(Ok(chunk)) = body.data().await {
        // An empty DATA (a client's bare END_STREAM) is not echoed: the h2 crate counts
        // empty frames as a flood.
        if chunk.is_empty() {
            stats.empty_data.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        len += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
        send.reserve_capacity(chunk.len());
        if send.send_data(chunk, false).is_err() {
            return;
        }
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("x-body-len", len.into());
    trailers.insert("grpc-status", grpc_status);
    if let Ok(Some(t)) = body.trailers().await {
        if let Some(v) = t.get("x-client-trailer") {
            trailers.insert("x-client-trailer", v.clone());
        }
        if path.starts_with("/trailer-fields") {
            let mut names: Vec<&str> = t.keys().map(|n| n.as_str()).collect();
            names.sort_unstable();
            if let Ok(v) = HeaderValue::from_str(&names.join(",")) {
                trailers.insert("x-trailer-fields", v);
            }
        }
    }
    if path.starts_with("/quote-name-trailer") {
        trailers.insert(quote_name(), HeaderValue::from_static("1"));
    }
    if bad_trailers {
        for (name, value) in FORBIDDEN_TRAILERS {
            trailers.append(name, HeaderValue::from_static(value));
        }
    }
    let _ = send.send_trailers(trailers);
}

/// `x"y`: HTTP/2 allows the name (the `http` crate takes it as an HTTP/2 name), HTTP/1.1
/// does not (not a token).
pub fn quote_name() -> http::HeaderName {
    http::HeaderName::from_lowercase(b"x\"y").expect("testkit: an HTTP/2 field name")
}

/// A request's fields as sorted `name: value` lines, split `cookie` fields joined with
/// "; " (RFC 9113 8.2.3) so that a request from HTTP/1.1 compares equal.
fn show_fields(headers: &HeaderMap) -> String {
    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    let mut lines: Vec<String> = headers
        .iter()
        .filter(|(name, _)| *name != "cookie")
        .map(|(name, value)| format!("{name}: {}\n", text(value)))
        .collect();
    let cookies: Vec<String> = headers.get_all("cookie").iter().map(text).collect();
    if !cookies.is_empty() {
        lines.push(format!("cookie: {}\n", cookies.join("; ")));
    }
    lines.sort();
    lines.concat()
}

/// Fields RFC 9110 6.5.1 forbids in trailers, sent by `/bad-trailers`.
pub const FORBIDDEN_TRAILERS: [(&str, &str); 7] = [
    ("content-length", "99"),
    ("host", "evil.example"),
    ("authorization", "Basic eDp5"),
    ("set-cookie", "session=evil"),
    ("trailer", "x-body-len"),
    ("content-type", "text/evil"),
    ("cache-control", "no-store"),
];

/// The gRPC health service (grpc.health.v1), messages written by hand: the service named
/// `""` or `"known"` answers SERVING (1) or NOT_SERVING (2); any other is NOT_FOUND (5), a
/// trailers-only response.
async fn grpc_health(mut body: RecvStream, mut respond: SendResponse<Bytes>, serving: bool) {
    let mut request = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        request.extend_from_slice(&chunk);
    }
    // Frame header (5 bytes), then field 1 (0x0a, one-byte length) if there is a service.
    let service = match request.get(5..7) {
        Some([0x0a, len]) => request.get(7..7 + *len as usize).unwrap_or_default(),
        _ => &[][..],
    };
    let mut head = Response::builder().header("content-type", "application/grpc");
    if service != b"" && service != b"known" {
        head = head
            .header("grpc-status", "5")
            .header("grpc-message", "unknown service");
        let _ = respond.send_response(head.body(()).expect("testkit: head"), true);
        return;
    }
    let Ok(mut send) = respond.send_response(head.body(()).expect("testkit: head"), false) else {
        return;
    };
    let status = if serving { 1 } else { 2 };
    let _ = send.send_data(Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]), false);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}
