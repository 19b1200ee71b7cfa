//! Keep-alive on both sides (client connection limits, HTTP/1.0, `Connection: close`,
//! upstream connection reuse and upstreams that close) and pipelined requests.

mod common;

use common::{single, split_head, upstream_head, Conf, WAIT};
use weir_testkit::{chunked, send_raw_once, wait_until_async, Backend};

#[tokio::test]
async fn twenty_requests_reuse_one_upstream_connection() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    for i in 0..20 {
        let path = format!("/r{i}");
        let r = c.get(&path, "h").await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), None);
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {path} HTTP/1.1"), "h", "")
        );
    }
    assert_eq!(b.requests_served(), 20);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn upstream_connections_are_shared_across_client_connections() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    for i in 0..5 {
        // One client connection after another: the pooled upstream connection is reused.
        let mut c = weir.client().await;
        let r = c.get(&format!("/c{i}"), "h").await.unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(b.requests_served(), 5);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn keepalive_requests_limit_closes_after_the_last_response() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).listener("keepalive_requests = 3").start();
    let mut c = weir.client().await;
    for i in 1..=3 {
        let r = c.get(&format!("/{i}"), "h").await.unwrap();
        assert_eq!(r.status, 200, "request {i}");
        let expected = if i == 3 { Some("close") } else { None };
        assert_eq!(r.header("connection"), expected, "request {i}");
    }
    assert!(c.is_closed_by_peer().await, "closed after the 3rd response");
    assert_eq!(b.requests_served(), 3);
    // The limit is per client connection: the upstream connection survives.
    let mut c = weir.client().await;
    assert_eq!(c.get("/4", "h").await.unwrap().status, 200);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn keepalive_requests_limit_also_applies_to_default_responses() {
    let weir = Conf::new().listener("keepalive_requests = 2").start();
    let mut c = weir.client().await;
    let r = c.get("/a", "h").await.unwrap();
    assert_eq!((r.status, r.header("connection")), (404, None));
    let r = c.get("/b", "h").await.unwrap();
    assert_eq!((r.status, r.header("connection")), (404, Some("close")));
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn http10_without_keep_alive_gets_the_response_then_close() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    for i in 0..2 {
        let raw = send_raw_once(weir.addr, b"GET /old HTTP/1.0\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        let expected = upstream_head("GET /old HTTP/1.1", "h", "");
        assert!(head.contains(&format!("\r\nContent-Length: {}\r\n", expected.len())));
        assert_eq!(String::from_utf8_lossy(&body), expected, "request {i}");
    }
    // Weir speaks HTTP/1.1 keep-alive upstream whatever the client speaks.
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn http10_with_keep_alive_stays_open() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    for path in ["/a", "/b", "/c"] {
        c.send_raw(
            format!("GET {path} HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let r = c.read_response(false).await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), Some("keep-alive"));
        // The client's Connection header is hop-by-hop: not forwarded.
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {path} HTTP/1.1"), "h", "")
        );
    }
    // Ending with a plain HTTP/1.0 request closes it.
    c.send_raw(b"GET /d HTTP/1.0\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn connection_close_from_the_client_is_honoured() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    assert_eq!(c.get("/first", "h").await.unwrap().status, 200);
    let r = c
        .request(
            "GET",
            "/last",
            &[("Host", "h"), ("Connection", "close")],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.body_str(), upstream_head("GET /last HTTP/1.1", "h", ""));
    assert!(c.is_closed_by_peer().await);
    // Only the client connection closed; the upstream one is reused.
    let mut c = weir.client().await;
    assert_eq!(c.get("/again", "h").await.unwrap().status, 200);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn upstream_that_closes_after_each_response_is_never_reused() {
    let b = Backend::close_after_each();
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    for i in 0..5 {
        let path = format!("/n{i}");
        let r = c.get(&path, "h").await.unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("x-backend"), Some("close-after-each"));
        // The upstream's Connection: close is hop-by-hop: the client connection stays open.
        assert_eq!(r.header("connection"), None);
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {path} HTTP/1.1"), "h", "")
        );
    }
    assert_eq!(b.requests_served(), 5);
    assert_eq!(b.connections_accepted(), 5);
}

#[tokio::test]
async fn pooled_connection_closed_by_the_upstream_is_never_a_client_error() {
    // Closes each connection (FIN, no Connection: close) right after its first response.
    let b = Backend::idle_closer(1);
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    for i in 0..10 {
        let path = format!("/i{i}");
        let r = c.get(&path, "h").await.unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("x-backend"), Some("idle-closer"));
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {path} HTTP/1.1"), "h", "")
        );
    }
    assert_eq!(
        b.requests_served(),
        10,
        "each request reached the backend once"
    );
    assert_eq!(b.connections_accepted(), 10);
}

#[tokio::test]
async fn pooled_connection_closed_after_several_requests() {
    let b = Backend::idle_closer(3);
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    for i in 0..9 {
        let r = c.get(&format!("/i{i}"), "h").await.unwrap();
        assert_eq!(r.status, 200, "request {i}");
    }
    assert_eq!(b.requests_served(), 9);
    assert_eq!(b.connections_accepted(), 3);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(
        b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n\
          GET /2 HTTP/1.1\r\nHost: h\r\n\r\n\
          POST /3 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
          GET /4 HTTP/1.1\r\nHost: h\r\n\r\n\
          GET /5 HTTP/1.1\r\nHost: h\r\n\r\n",
    )
    .await
    .unwrap();
    for i in 1..=5 {
        let r = c.read_response(false).await.unwrap();
        assert_eq!(r.status, 200, "response {i}");
        let expected = if i == 3 {
            let mut s = upstream_head("POST /3 HTTP/1.1", "h", "Content-Length: 5\r\n");
            s.push_str("hello");
            s
        } else {
            upstream_head(&format!("GET /{i} HTTP/1.1"), "h", "")
        };
        assert_eq!(r.body_str(), expected, "response {i}");
    }
    assert_eq!(b.requests_served(), 5);
    assert_eq!(b.connections_accepted(), 1);
    // And the connection is still good afterwards.
    assert_eq!(c.get("/6", "h").await.unwrap().status, 200);
}

#[tokio::test]
async fn pipelined_chunked_post_and_default_responses_stay_in_order() {
    let b = Backend::echo("e");
    let weir = Conf::new()
        .route("app", "up", &[r#"path_prefix = "/app/""#])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let mut bytes = b"GET /app/1 HTTP/1.1\r\nHost: h\r\n\r\n\
                      POST /app/2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    bytes.extend_from_slice(&chunked::encode(&[b"abc", b"defgh"], &[]));
    bytes.extend_from_slice(b"GET /none HTTP/1.1\r\nHost: h\r\n\r\n");
    bytes.extend_from_slice(b"HEAD /app/4 HTTP/1.1\r\nHost: h\r\n\r\n");
    bytes.extend_from_slice(b"GET /app/5 HTTP/1.1\r\nHost: h\r\n\r\n");
    c.send_raw(&bytes).await.unwrap();

    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.body_str(), upstream_head("GET /app/1 HTTP/1.1", "h", ""));
    let r = c.read_response(false).await.unwrap();
    let mut expected = upstream_head("POST /app/2 HTTP/1.1", "h", "").replace(
        "\r\nX-Real-IP",
        "\r\nTransfer-Encoding: chunked\r\nX-Real-IP",
    );
    expected.push_str("abcdefgh");
    assert_eq!(r.body_str(), expected);
    let r = c.read_response(false).await.unwrap();
    assert_eq!((r.status, &*r.body_str()), (404, "no route\n"));
    let r = c.read_response(true).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.body_str(), upstream_head("GET /app/5 HTTP/1.1", "h", ""));
    assert_eq!(b.requests_served(), 4);
}

#[tokio::test]
async fn pipelined_requests_after_connection_close_are_not_served() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let raw = send_raw_once(
        weir.addr,
        b"GET /1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n\
          GET /2 HTTP/1.1\r\nHost: h\r\n\r\n",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 1, "{text}");
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);
    assert_eq!(b.requests_served(), 1);
}

/// One response on a client connection and what must follow it.
struct Persistence {
    name: &'static str,
    request: &'static str,
    status: u16,
    /// The `Connection` header the response must carry.
    connection: Option<&'static str>,
    /// The connection stays open (a second request is answered on it), else Weir closes it.
    open: bool,
}

/// Every kind of response Weir writes (proxied, the default response, its own errors) to
/// HTTP/1.0 and HTTP/1.1 clients: an HTTP/1.0 client whose connection stays open must be told
/// so (`Connection: keep-alive`: `ab -k` otherwise waits for a close that never comes), and
/// a connection that is not kept open says `Connection: close` and is closed.
fn persistence_cases() -> Vec<Persistence> {
    let case = |name, request, status, connection, open| Persistence {
        name,
        request,
        status,
        connection,
        open,
    };
    vec![
        case(
            "default response, ab -k",
            "GET /none HTTP/1.0\r\nHost: h\r\nConnection: Keep-Alive\r\nUser-Agent: ApacheBench/2.3\r\nAccept: */*\r\n\r\n",
            404,
            Some("keep-alive"),
            true,
        ),
        case(
            "default response to HEAD, HTTP/1.0 keep-alive",
            "HEAD /none HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            404,
            Some("keep-alive"),
            true,
        ),
        case(
            "default response after a body, HTTP/1.0 keep-alive",
            "POST /none HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
            404,
            Some("keep-alive"),
            true,
        ),
        case(
            "default response, HTTP/1.0",
            "GET /none HTTP/1.0\r\n\r\n",
            404,
            Some("close"),
            false,
        ),
        case(
            "default response, HTTP/1.1",
            "GET /none HTTP/1.1\r\nHost: h\r\n\r\n",
            404,
            None,
            true,
        ),
        case(
            "default response, HTTP/1.1 Connection: close",
            "GET /none HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            404,
            Some("close"),
            false,
        ),
        case(
            "proxied, HTTP/1.0 keep-alive",
            "GET /app/x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            200,
            Some("keep-alive"),
            true,
        ),
        case(
            "proxied, HTTP/1.1 Connection: close",
            "GET /app/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            200,
            Some("close"),
            false,
        ),
        // An upstream failure, the request read whole: kept, as nginx does.
        case(
            "502 from Weir, HTTP/1.0 keep-alive",
            "GET /down/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            502,
            Some("keep-alive"),
            true,
        ),
        case(
            "502 from Weir, HTTP/1.0",
            "GET /down/ HTTP/1.0\r\n\r\n",
            502,
            Some("close"),
            false,
        ),
        case(
            "413 from Weir, HTTP/1.0 keep-alive",
            "POST /app/ HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 5000\r\n\r\n",
            413,
            Some("close"),
            false,
        ),
        case(
            "400 from Weir, HTTP/1.1",
            "GET /app/ HTTP/1.1\r\n\r\n",
            400,
            Some("close"),
            false,
        ),
    ]
}

#[tokio::test]
async fn every_response_says_whether_the_connection_stays_open() {
    let b = Backend::echo("e");
    let dead = common::dead_port();
    let weir = Conf::new()
        .listener(r#"max_body_size = "1KiB""#)
        .route("app", "up", &[r#"path_prefix = "/app/""#])
        .route("down", "dead", &[r#"path_prefix = "/down/""#])
        .upstream("up", &[b.addr()], &[])
        .upstream("dead", &[dead.addr], &[])
        .start();
    for case in persistence_cases() {
        let name = case.name;
        let mut c = weir.client().await;
        c.send_raw(case.request.as_bytes()).await.unwrap();
        let head_request = case.request.starts_with("HEAD");
        let r = c.read_response(head_request).await.unwrap();
        assert_eq!(r.status, case.status, "{name}");
        assert_eq!(r.header("connection"), case.connection, "{name}");
        if case.open {
            // What ab -k does next: another request on the same connection.
            c.send_raw(b"GET /none HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .await
                .unwrap();
            let r = c.read_response(false).await.unwrap();
            assert_eq!(r.status, 404, "{name}: second request");
            assert_eq!(r.header("connection"), Some("keep-alive"), "{name}");
        } else {
            assert!(c.is_closed_by_peer().await, "{name}: closed");
        }
    }
}
