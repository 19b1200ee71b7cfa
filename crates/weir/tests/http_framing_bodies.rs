//! Message bodies: Content-Length and chunked both ways, re-framing for HTTP/1.0 clients,
//! close-delimited responses, bodiless responses (HEAD, 204, 304) and 50 MiB bodies
//! streamed in both directions.

mod common;

use common::{echoing_raw_chunked, single, split_head, upstream_head, Conf};
use tokio::sync::mpsc::UnboundedReceiver;
use weir_testkit::{
    chunked, hash_bytes, pattern_hash, pattern_vec, send_raw_once, sink_summary, Backend, Client,
    Hasher,
};

const BIG: u64 = 50 * 1024 * 1024;

#[tokio::test]
async fn content_length_bodies_both_ways() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let body = b"0123456789\r\n\r\nnot a head";
    let r = c
        .request(
            "PUT",
            "/doc",
            &[("Host", "h"), ("Content-Type", "text/plain")],
            body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let mut expected = upstream_head(
        "PUT /doc HTTP/1.1",
        "h",
        &format!(
            "Content-Type: text/plain\r\nContent-Length: {}\r\n",
            body.len()
        ),
    )
    .into_bytes();
    expected.extend_from_slice(body);
    assert_eq!(r.body, expected);
    assert_eq!(
        r.header("content-length"),
        Some(&*expected.len().to_string())
    );
    // A zero Content-Length is a bodiless request that still passes its header.
    let r = c
        .request(
            "POST",
            "/empty",
            &[("Host", "h"), ("Content-Length", "0")],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(
        r.body_str(),
        upstream_head("POST /empty HTTP/1.1", "h", "Content-Length: 0\r\n")
    );
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn body_sent_after_the_head_in_pieces() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(b"POST /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n")
        .await
        .unwrap();
    // The head is forwarded before the body arrives.
    assert!(weir_testkit::wait_until_async(common::WAIT, || b.in_flight() == 1).await);
    c.send_raw(b"hello").await.unwrap();
    c.send_raw(b" world").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    let mut expected = upstream_head("POST /slow HTTP/1.1", "h", "Content-Length: 11\r\n");
    expected.push_str("hello world");
    assert_eq!(r.body_str(), expected);
    // The connection is reusable after a streamed body.
    assert_eq!(c.get("/next", "h").await.unwrap().status, 200);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn chunked_request_body_reaches_the_backend_intact() {
    let b = Backend::sink();
    let data = pattern_vec(1_000_003);
    let pieces: Vec<&[u8]> = data.chunks(65_521).collect();
    let body = chunked::encode(&pieces, &[("X-Checksum", "abc")]);
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c
        .request(
            "POST",
            "/upload",
            &[("Transfer-Encoding", "chunked")],
            &body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        sink_summary(data.len() as u64, hash_bytes(&data))
    );
    // The connection and the upstream connection are reusable afterwards.
    let r = c
        .request(
            "POST",
            "/again",
            &[("Transfer-Encoding", "chunked")],
            b"3\r\nabc\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
    assert_eq!(r.body_str(), sink_summary(3, hash_bytes(b"abc")));
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn chunked_request_is_forwarded_chunked_with_extensions_and_trailers() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let body = b"3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
    let r = c
        .request(
            "POST",
            "/c",
            &[("Host", "h"), ("Transfer-Encoding", "chunked")],
            body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // The echo shows the head and the decoded body: the upstream got valid chunked coding.
    let mut expected = upstream_head("POST /c HTTP/1.1", "h", "").replace(
        "\r\nX-Real-IP",
        "\r\nTransfer-Encoding: chunked\r\nX-Real-IP",
    );
    expected.push_str("abc");
    assert_eq!(r.body_str(), expected);
}

#[tokio::test]
async fn chunked_response_to_http11_stays_chunked_with_its_trailer() {
    let b = Backend::chunked(&["hello ", "chunked ", "world"]);
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.body_str(), "hello chunked world");
    assert_eq!(r.trailer("x-trailer"), Some("done"));
    // Byte for byte on the wire.
    let raw = send_raw_once(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, body) = split_head(&raw);
    assert!(
        head.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{head}"
    );
    assert_eq!(
        String::from_utf8_lossy(&body),
        "6\r\nhello \r\n8\r\nchunked \r\n5\r\nworld\r\n0\r\nX-Trailer: done\r\n\r\n"
    );
    // Keep-alive survives a chunked response.
    assert_eq!(
        c.get("/2", "h").await.unwrap().body_str(),
        "hello chunked world"
    );
    assert_eq!(
        b.connections_accepted(),
        1,
        "the upstream connection is reused after chunked responses"
    );
}

#[tokio::test]
async fn chunked_response_to_http10_is_dechunked_and_closes() {
    let b = Backend::chunked(&["hello ", "world"]);
    let weir = single(b.addr()).start();
    for request in [
        &b"GET / HTTP/1.0\r\nHost: h\r\n\r\n"[..],
        // Even a keep-alive HTTP/1.0 client: the body can only be delimited by closing.
        b"GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n",
    ] {
        let raw = send_raw_once(weir.addr, request).await.unwrap();
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding"),
            "{head}"
        );
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        assert_eq!(String::from_utf8_lossy(&body), "hello world");
    }
}

#[tokio::test]
async fn close_delimited_response_reaches_the_client_with_connection_close() {
    let b = Backend::close_delimited("the body ends when the connection does");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.body_str(), "the body ends when the connection does");
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn head_gets_headers_without_a_body_and_the_connection_stays_usable() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c
        .request("HEAD", "/h", &[("Host", "h")], b"")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    // The Content-Length a GET would have had: the length of the upstream head.
    let would_be = upstream_head("HEAD /h HTTP/1.1", "h", "").len();
    assert_eq!(r.header("content-length"), Some(&*would_be.to_string()));
    let r = c.get("/after", "h").await.unwrap();
    assert_eq!(r.body_str(), upstream_head("GET /after HTTP/1.1", "h", ""));
    // And on the wire: nothing follows the head.
    let raw = send_raw_once(
        weir.addr,
        b"HEAD /h HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, rest) = split_head(&raw);
    assert!(
        head.contains(&format!("Content-Length: {would_be}\r\n")),
        "{head}"
    );
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
}

#[tokio::test]
async fn head_of_a_chunked_resource_is_bodiless() {
    let b = Backend::chunked(&["abc"]);
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c.request("HEAD", "/", &[("Host", "h")], b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(c.get("/", "h").await.unwrap().body_str(), "abc");
}

#[tokio::test]
async fn no_content_and_not_modified_carry_no_body() {
    for (status, extra) in [(204u16, ("X-Empty", "yes")), (304, ("ETag", "\"v1\""))] {
        let b = Backend::fixed(status, &[extra], "");
        let weir = single(b.addr()).start();
        let mut c = weir.client().await;
        for _ in 0..3 {
            let r = c.get("/", "h").await.unwrap();
            assert_eq!(r.status, status);
            assert_eq!(r.header(extra.0), Some(extra.1));
            assert!(r.body.is_empty());
            assert_eq!(r.header("transfer-encoding"), None);
        }
        let raw = send_raw_once(
            weir.addr,
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let (head, rest) = split_head(&raw);
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
        assert!(
            rest.is_empty(),
            "{status}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert_eq!(b.connections_accepted(), 1, "{status}: upstream reused");
    }
}

#[tokio::test]
async fn bodiless_status_with_a_content_length_header_sends_no_body() {
    // A 304 may carry the Content-Length of the representation; no body follows it.
    let b = Backend::raw_response(
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: \"x\"\r\n\r\n",
    );
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 304);
    assert_eq!(r.header("content-length"), Some("1234"));
    assert!(r.body.is_empty());
    assert_eq!(c.get("/", "h").await.unwrap().status, 304);
}

/// Big-body tests do slow work (hashing 50 MiB in a debug build, on a loaded machine)
/// between requests: generous idle timeouts keep that from closing the connection.
fn big_body_weir(backend: std::net::SocketAddr) -> common::Weir {
    single(backend)
        .listener(r#"keepalive_timeout = "60s""#)
        .listener(r#"header_timeout = "60s""#)
        .start()
}

#[tokio::test]
async fn fifty_mib_response_streams_intact() {
    let b = Backend::huge(BIG);
    let weir = big_body_weir(b.addr());
    let mut c = weir.client().await;
    let r = c.get("/big", "h").await.unwrap();
    // The connection is still in sync after the big body.
    let head = c
        .request("HEAD", "/big", &[("Host", "h")], b"")
        .await
        .unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(b.connections_accepted(), 1);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(&*BIG.to_string()));
    assert_eq!(r.body.len() as u64, BIG);
    assert_eq!(hash_bytes(&r.body), pattern_hash(BIG));
}

#[tokio::test]
async fn fifty_mib_request_streams_intact() {
    let b = Backend::sink();
    let data = pattern_vec(BIG as usize);
    let mut h = Hasher::new();
    h.update(&data);
    let weir = big_body_weir(b.addr());
    let mut c = weir.client().await;
    let r = c
        .request("POST", "/big", &[("Host", "h")], &data)
        .await
        .unwrap();
    let small = c.get("/small", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), h.summary());
    assert_eq!(r.body_str(), sink_summary(BIG, pattern_hash(BIG)));
    assert_eq!(small.body_str(), sink_summary(0, hash_bytes(b"")));
    assert_eq!(b.connections_accepted(), 1);
}

/// An HTTP/1.1 upstream's chunked trailer section reaches an HTTP/1.1 client re-written:
/// the fields no trailer may carry (framing, routing, credentials, hop-by-hop, cookies,
/// those the head's `Connection` lists) are dropped, the rest go as they came; a section
/// left empty is the body's end alone.
/// A line that is not a field (an obs-fold) is bad framing, as a bad chunk is: a 502 when
/// it came with the head, else the body cut short; never relayed.
#[tokio::test]
async fn forbidden_trailer_fields_of_an_http1_upstream_do_not_reach_an_http11_client() {
    let mixed = Backend::raw_response(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nTransfer-Encoding: chunked\r\n\r\n\
          2\r\nok\r\n0\r\nX-Checksum: abc\r\nContent-Length: 99\r\nHost: evil.test\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\nTrailer: X-Checksum\r\n\
          Set-Cookie: s=1\r\nAuthorization: Basic eA==\r\nx-hop: 1\r\nx-keep:1\r\n\r\n",
    );
    let only_forbidden = Backend::raw_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\
          Content-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\n",
    );
    let folded = Backend::raw_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\
          X-A: 1\r\n folded\r\n\r\n",
    );
    let weir = Conf::new()
        .route("mixed", "mixed", &["path_prefix = \"/mixed\""])
        .route("folded", "folded", &["path_prefix = \"/folded\""])
        .route("rest", "forbidden", &[])
        .upstream("mixed", &[mixed.addr()], &[])
        .upstream("folded", &[folded.addr()], &[])
        .upstream("forbidden", &[only_forbidden.addr()], &[])
        .start();
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
    let raw = send_raw_once(weir.addr, get("/mixed").as_bytes())
        .await
        .unwrap();
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(
        String::from_utf8_lossy(&body),
        "2\r\nok\r\n0\r\nX-Checksum: abc\r\nx-keep:1\r\n\r\n"
    );
    let raw = send_raw_once(weir.addr, get("/other").as_bytes())
        .await
        .unwrap();
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(String::from_utf8_lossy(&body), "2\r\nok\r\n0\r\n\r\n");
    let raw = send_raw_once(weir.addr, get("/folded").as_bytes())
        .await
        .unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(!raw.contains("X-A") && !raw.contains("folded"), "{raw}");
}

/// Sends a chunked request (`head`, the chunk `abc`, then the last chunk and `trailers`)
/// twice on `c`: whole, its body and trailers with the head; then streamed, its trailers
/// once `arrivals` says the upstream ([`echoing_raw_chunked`]) has the first chunk.
/// Returns what the upstream got of each request: `[whole, streamed]`.
async fn whole_then_streamed(
    c: &mut Client,
    arrivals: &mut UnboundedReceiver<()>,
    head: &[u8],
    trailers: &[u8],
) -> [String; 2] {
    c.send_raw(&[head, b"3\r\nabc\r\n", trailers].concat())
        .await
        .unwrap();
    let whole = c.read_response(false).await.unwrap();
    assert_eq!(whole.status, 200);
    arrivals.recv().await.expect("first body bytes");
    c.send_raw(&[head, b"3\r\nabc\r\n"].concat()).await.unwrap();
    arrivals.recv().await.expect("first body bytes");
    c.send_raw(trailers).await.unwrap();
    let streamed = c.read_response(false).await.unwrap();
    assert_eq!(streamed.status, 200);
    [whole, streamed].map(|r| r.body_str().into_owned())
}

/// A client's chunked trailer section reaches an HTTP/1.1 upstream re-written as a
/// response's does: whole in Weir's buffer with the head, or streamed after it.
#[tokio::test]
async fn forbidden_trailer_fields_of_a_client_do_not_reach_an_http1_upstream() {
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let weir = single(echoing_raw_chunked(arrived)).start();
    let head = b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    let trailers = b"0\r\nX-Sum: 1\r\nHost: evil.test\r\nContent-Length: 5\r\n\
                     Transfer-Encoding: chunked\r\nTE: trailers\r\nCookie: c=1\r\nx-b:2\r\n\r\n";
    let sent_on = "\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\nx-b:2\r\n\r\n";
    let mut c = weir.client().await;
    for got in whole_then_streamed(&mut c, &mut arrivals, head, trailers).await {
        assert!(got.ends_with(sent_on), "{got:?}");
    }
}

/// A client's trailer fields lose every name its request head does not carry upstream as
/// it came, whole in Weir's buffer with the head or streamed after it: an upstream that
/// merges trailers into the head (Go's `net/http` hands them to the handler) would
/// otherwise take the client's own `X-Forwarded-For` or `X-Real-IP` (in the CGI spelling
/// too), request id, a name the route's `request_headers` sets or removes, or a field the
/// head's `Connection` lists, for the head's. The other fields go as they came.
#[tokio::test]
async fn a_clients_trailers_lose_the_names_its_head_does_not_carry() {
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let rules = r#"request_headers = { set = { "X-User" = "weir" }, remove = ["x-secret"] }"#;
    let weir = Conf::new()
        .with_request_ids()
        .route("all", "up", &[rules])
        .upstream("up", &[echoing_raw_chunked(arrived)], &[])
        .start();
    let head = b"POST /up HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
                 Transfer-Encoding: chunked\r\n\r\n";
    let trailers = b"0\r\nX-Sum: 1\r\nX-Forwarded-For: 6.6.6.6\r\nx-real-ip: 6.6.6.6\r\n\
                     X_Forwarded_For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n\
                     X-Forwarded-Host: evil.test\r\nX-Request-Id: forged\r\nX-User: admin\r\n\
                     x_secret: s\r\nx-hop: 2\r\nx-b:2\r\n\r\n";
    let sent_on = "\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\nx-b:2\r\n\r\n";
    let mut c = weir.client().await;
    for got in whole_then_streamed(&mut c, &mut arrivals, head, trailers).await {
        assert!(got.ends_with(sent_on), "{got:?}");
        // The head says what Weir says, once.
        assert_eq!(got.matches("X-Forwarded-For: ").count(), 1, "{got:?}");
        assert!(got.contains("\r\nX-User: weir\r\n"), "{got:?}");
    }
}

/// A response's trailer fields lose the names its head loses to the route's
/// `response_headers`: a `Server` it hides (`remove`) or replaces (`set`) does not come
/// back in the trailer section.
#[tokio::test]
async fn a_server_field_the_route_hides_does_not_come_back_as_a_trailer() {
    let raw = b"HTTP/1.1 200 OK\r\nServer: backend/1.0\r\nTransfer-Encoding: chunked\r\n\r\n\
                2\r\nok\r\n0\r\nServer: backend/1.0\r\nserver: again\r\nX-Kept: 1\r\n\r\n";
    let b = Backend::raw_response(raw);
    let weir = Conf::new()
        .route(
            "hidden",
            "up",
            &[
                "path_prefix = \"/hidden\"",
                r#"response_headers = { remove = ["Server"] }"#,
            ],
        )
        .route(
            "set",
            "up",
            &[r#"response_headers = { set = { "Server" = "weir" } }"#],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    for path in ["/hidden", "/set"] {
        let get = format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        let raw = send_raw_once(weir.addr, get.as_bytes()).await.unwrap();
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(!head.contains("backend"), "{head}");
        assert_eq!(
            String::from_utf8_lossy(&body),
            "2\r\nok\r\n0\r\nX-Kept: 1\r\n\r\n",
            "{path}"
        );
    }
}
