//! Response policy on HTTP/2 client streams (h2c and TLS with ALPN h2): a route's
//! `response_headers` rules (with variables) and `compression` (negotiation, head edits,
//! bodies that decode to the original for every algorithm and upstream framing), as for
//! HTTP/1.1 clients; `response_headers` also on an HTTP/2 upstream's responses.

mod common;
mod compression_support;

use std::sync::Arc;

use bytes::Bytes;
use h2::client::SendRequest;
use http::{Method, Request, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use common::{tls_table, Conf};
use compression_support::{decode, PieceBackend, Reply, TEXT};
use weir_testkit::certs::TestCa;
use weir_testkit::{Backend, H2Backend};

const NAME: &str = "h2.example.com";
const RULES: &str = r#"response_headers = { set = { "Strict-Transport-Security" = "max-age=63072000" }, add = { "X-Served" = "{scheme} {path} {query}" }, remove = ["server"] }"#;

async fn h2c(addr: std::net::SocketAddr) -> SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    // The 1-byte pieces of some cases reach the client as as many small DATA frames; the
    // h2 crate's client sends GOAWAY ENHANCE_YOUR_CALM once it holds more than its small-frame
    // budget unread (about 128 with the default window), which a test thread descheduled on a
    // busy machine can. What these tests check is the bodies, not that budget.
    let (client, conn) = h2::client::Builder::new()
        .data_frame_budget(1 << 24)
        .handshake(tcp)
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    client
}

async fn h2_tls(addr: std::net::SocketAddr, ca: &TestCa) -> SendRequest<Bytes> {
    let mut roots = rustls::RootCertStore::empty();
    let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).expect("CA");
    roots.add(ca_der).expect("CA certificate");
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    let name = ServerName::try_from(NAME).expect("server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let (client, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    client
}

/// Sends `method path` with `accept` as Accept-Encoding (none when empty): head and body.
async fn fetch(
    client: &mut SendRequest<Bytes>,
    method: Method,
    path: &str,
    accept: &str,
) -> (Response<()>, Vec<u8>) {
    let (head, body, _) = fetch_with_trailers(client, method, path, accept).await;
    (head, body)
}

/// As [`fetch`], with the trailers that end the response.
async fn fetch_with_trailers(
    client: &mut SendRequest<Bytes>,
    method: Method,
    path: &str,
    accept: &str,
) -> (Response<()>, Vec<u8>, Option<http::HeaderMap>) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("https://{NAME}{path}"));
    if !accept.is_empty() {
        request = request.header("accept-encoding", accept);
    }
    let request = request.body(()).expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    let (head, mut body) = response.await.expect("response").into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("trailers");
    (Response::from_parts(head, ()), out, trailers)
}

fn all(head: &Response<()>, name: &str) -> Vec<String> {
    head.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// Checks the rules of `RULES` on a response to `/p?q=1` over `scheme`.
fn assert_rules(head: &Response<()>, scheme: &str) {
    assert_eq!(all(head, "server"), Vec::<String>::new());
    assert_eq!(all(head, "strict-transport-security"), ["max-age=63072000"]);
    assert_eq!(
        all(head, "x-served"),
        ["a".to_string(), format!("{scheme} /p q=1")]
    );
    assert_eq!(all(head, "x-keep"), ["1"]);
}

fn fixed_backend() -> Backend {
    Backend::fixed(
        200,
        &[
            ("Server", "backend/1.0"),
            ("X-Keep", "1"),
            ("Strict-Transport-Security", "max-age=1"),
            ("X-Served", "a"),
        ],
        "ok",
    )
}

#[tokio::test]
async fn response_header_rules_apply_to_h2c_streams() {
    let b = fixed_backend();
    let weir = Conf::new()
        .route("api", "up", &[RULES])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    let (head, body) = fetch(&mut client, Method::GET, "/p?q=1", "").await;
    assert_eq!(body, b"ok");
    assert_rules(&head, "http");
}

#[tokio::test]
async fn response_header_rules_apply_to_tls_h2_streams() {
    let ca = TestCa::new("h2 policy CA");
    let leaf = ca.leaf(&[NAME]);
    let b = fixed_backend();
    let weir = Conf::new()
        .listener(&tls_table(&[&leaf], ""))
        .route("api", "up", &[RULES])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut client = h2_tls(weir.addr, &ca).await;
    let (head, body) = fetch(&mut client, Method::GET, "/p?q=1", "").await;
    assert_eq!(body, b"ok");
    assert_rules(&head, "https");
}

#[tokio::test]
async fn response_header_rules_apply_to_an_h2_upstreams_responses() {
    let b = H2Backend::h2c();
    let weir = Conf::new()
        .route("api", "up", &[r#"response_headers = { set = { "X-Env" = "prod" }, add = { "X-Rule-Path" = "{path}" }, remove = ["content-type"] }"#])
        .upstream("up", &[b.addr()], &["protocol = \"h2c\""])
        .start();
    let mut client = h2c(weir.addr).await;
    let (head, _) = fetch(&mut client, Method::GET, "/p?q=1", "").await;
    assert_eq!(all(&head, "x-env"), ["prod"]);
    assert_eq!(all(&head, "x-rule-path"), ["/p"]);
    assert_eq!(all(&head, "content-type"), Vec::<String>::new());
}

#[tokio::test]
async fn h2c_streams_get_compressed_bodies_that_decode_for_every_algorithm_and_framing() {
    let b = PieceBackend::start();
    let weir = Conf::new()
        .route("c", "up", &[r#"compression = { min_size = "100" }"#])
        .upstream("up", &[b.addr], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    let body = TEXT.repeat(40);
    for algorithm in ["gzip", "br", "zstd"] {
        for framing in ["length", "chunked", "close"] {
            for piece in [1, 7, 1000, 0] {
                b.set(Reply::ok("application/json", &body, framing, piece));
                let (head, got) = fetch(&mut client, Method::GET, "/", algorithm).await;
                let what = format!("{algorithm} {framing} in {piece}-byte pieces");
                assert_eq!(all(&head, "content-encoding"), [algorithm], "{what}");
                assert_eq!(all(&head, "content-length"), Vec::<String>::new(), "{what}");
                assert_eq!(all(&head, "vary"), ["Accept-Encoding"], "{what}");
                assert_eq!(decode(algorithm, &got), body.as_bytes(), "{what}");
            }
        }
    }
}

#[tokio::test]
async fn h2_compression_rules_match_http1() {
    let ca = TestCa::new("h2 compression CA");
    let leaf = ca.leaf(&[NAME]);
    let b = PieceBackend::start();
    let weir = Conf::new()
        .listener(&tls_table(&[&leaf], ""))
        .route(
            "c",
            "up",
            &[r#"compression = { algorithms = ["br", "gzip"] }"#],
        )
        .upstream("up", &[b.addr], &[])
        .start();
    let mut client = h2_tls(weir.addr, &ca).await;
    let big = TEXT.repeat(40);
    b.set(Reply::raw(
        "200 OK",
        "Content-Type: text/html\r\nETag: \"v1\"\r\n",
        &big,
    ));
    for (accept, want) in [
        ("gzip, br", Some("br")),
        ("br;q=0.5, gzip", Some("gzip")),
        ("gzip;q=0", None),
    ] {
        let (head, got) = fetch(&mut client, Method::GET, "/", accept).await;
        assert_eq!(all(&head, "vary"), ["Accept-Encoding"], "{accept}");
        match want {
            Some(a) => {
                assert_eq!(all(&head, "content-encoding"), [a], "{accept}");
                assert_eq!(all(&head, "etag"), ["W/\"v1\""], "{accept}");
                assert_eq!(decode(a, &got), big.as_bytes(), "{accept}");
            }
            None => {
                assert_eq!(all(&head, "content-encoding"), Vec::<String>::new());
                assert_eq!(all(&head, "etag"), ["\"v1\""]);
                assert_eq!(got, big.as_bytes());
            }
        }
    }
    let (head, got) = fetch(&mut client, Method::HEAD, "/", "gzip").await;
    assert_eq!(all(&head, "content-encoding"), Vec::<String>::new(), "HEAD");
    assert!(got.is_empty());
    b.set(Reply::raw(
        "200 OK",
        "Content-Type: text/html\r\nContent-Encoding: gzip\r\n",
        &big,
    ));
    let (head, got) = fetch(&mut client, Method::GET, "/", "br").await;
    assert_eq!(all(&head, "content-encoding"), ["gzip"], "already encoded");
    assert_eq!(all(&head, "vary"), Vec::<String>::new());
    assert_eq!(got, big.as_bytes());
}

/// On h2c as on HTTP/1: fields the route's rules set or remove count as absent (Vary
/// gets Accept-Encoding added, a dropped ETag is not put back weakened), and a 304 to a
/// client that negotiated a coding carries the weak ETag.
#[tokio::test]
async fn h2c_compression_honours_header_rules_and_weakens_304_etags() {
    let b = PieceBackend::start();
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &[
                "compression = { }",
                r#"response_headers = { set = { "Vary" = "Origin" }, remove = ["etag"] }"#,
            ],
        )
        .upstream("up", &[b.addr], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    let big = TEXT.repeat(40);
    let upstream = "Content-Type: text/css\r\nETag: \"v1\"\r\nVary: Accept-Encoding\r\n";
    b.set(Reply::raw("200 OK", upstream, &big));
    let (head, got) = fetch(&mut client, Method::GET, "/", "gzip").await;
    assert_eq!(all(&head, "content-encoding"), ["gzip"]);
    assert_eq!(all(&head, "etag"), Vec::<String>::new());
    assert_eq!(all(&head, "vary"), ["Origin", "Accept-Encoding"]);
    assert_eq!(decode("gzip", &got), big.as_bytes());
    let weir = Conf::new()
        .route("c", "up", &["compression = { }"])
        .upstream("up", &[b.addr], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    b.set(Reply::raw("304 Not Modified", "ETag: \"v1\"\r\n", ""));
    let (head, _) = fetch(&mut client, Method::GET, "/", "gzip").await;
    assert_eq!(head.status(), 304);
    assert_eq!(all(&head, "etag"), ["W/\"v1\""]);
}

/// A chunked response's trailers lose what its head lost: the digests of the uncompressed
/// body when the route compresses it, and the names of the route's `response_headers`
/// `set` and `remove`. Without compression the digest is the body's own and is kept.
#[tokio::test]
async fn trailers_lose_what_compression_and_header_rules_take_from_the_head() {
    let body = TEXT.repeat(40);
    let raw = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\nContent-Digest: sha-256=:AAAA=:\r\nX-Secret: 1\r\nX-Env: up\r\n\
         X-Kept: 2\r\n\r\n",
        body.len()
    );
    let b = Backend::raw_response(raw.as_bytes());
    let rules = r#"response_headers = { set = { "X-Env" = "prod" }, remove = ["x-secret"] }"#;
    let weir = Conf::new()
        .route("c", "up", &[r#"compression = { min_size = "100" }"#, rules])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    let names = |t: &http::HeaderMap| t.keys().map(|n| n.to_string()).collect::<Vec<_>>();
    let (head, got, trailers) = fetch_with_trailers(&mut client, Method::GET, "/", "gzip").await;
    assert_eq!(all(&head, "content-encoding"), ["gzip"]);
    assert_eq!(decode("gzip", &got), body.as_bytes());
    assert_eq!(names(&trailers.expect("trailers")), ["x-kept"]);
    let (head, got, trailers) = fetch_with_trailers(&mut client, Method::GET, "/", "").await;
    assert_eq!(all(&head, "content-encoding"), Vec::<String>::new());
    assert_eq!(got, body.as_bytes());
    assert_eq!(
        names(&trailers.expect("trailers")),
        ["content-digest", "x-kept"]
    );
}

/// An HTTP/2 client's trailers lose a `Server` the route's `response_headers` hides or
/// replaces in the head, as an HTTP/1.1 client's do.
#[tokio::test]
async fn a_server_field_the_route_hides_does_not_come_back_as_a_trailer() {
    let raw = b"HTTP/1.1 200 OK\r\nServer: backend/1.0\r\nTransfer-Encoding: chunked\r\n\r\n\
                2\r\nok\r\n0\r\nServer: backend/1.0\r\nX-Kept: 1\r\n\r\n";
    let b = Backend::raw_response(raw);
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &[r#"response_headers = { remove = ["Server"] }"#],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut client = h2c(weir.addr).await;
    let (head, got, trailers) = fetch_with_trailers(&mut client, Method::GET, "/", "").await;
    assert_eq!(all(&head, "server"), Vec::<String>::new());
    assert_eq!(got, b"ok");
    let trailers = trailers.expect("trailers");
    let names: Vec<_> = trailers.keys().map(|n| n.to_string()).collect();
    assert_eq!(names, ["x-kept"]);
}
