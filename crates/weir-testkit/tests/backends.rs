//! Each testkit backend, hit directly with the testkit client.

use std::time::{Duration, Instant};

use weir_testkit::{
    chunked, hash_bytes, pattern_hash, pattern_vec, send_raw_once, sink_summary, status_of,
    wait_until_async, Backend, Client, Hasher,
};

/// How long a poll waits for something expected: generous, only a hang costs it, and a
/// loaded two-core CI machine must never run out of it first.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn echo_returns_head_and_body_with_keep_alive() {
    let b = Backend::echo("one");
    let mut c = Client::connect(b.addr()).await.unwrap();
    let head = b"POST /p?q=1 HTTP/1.1\r\nHost: x\r\nX-Odd:  spaced \r\nContent-Length: 5\r\n\r\n";
    c.send_raw(head).await.unwrap();
    c.send_raw(b"hello").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.reason, "OK");
    assert_eq!(r.version, 1);
    assert_eq!(r.header("x-backend"), Some("one"));
    let mut expected = head.to_vec();
    expected.extend_from_slice(b"hello");
    assert_eq!(r.body, expected);
    assert_eq!(
        r.header("content-length"),
        Some(&*expected.len().to_string())
    );
    assert_eq!(r.header("connection"), None);

    let r = c.get("/second", "h").await.unwrap();
    assert_eq!(r.body_str(), "GET /second HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(b.connections_accepted(), 1);
    assert_eq!(b.requests_served(), 2);
    assert!(!c.is_closed_by_peer_within(Duration::from_millis(50)).await);
    // A request leaves `in_flight` just after its response was written.
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);
}

#[tokio::test]
async fn echo_head_chunked_pipelined_and_expect() {
    let b = Backend::echo("e");
    let mut c = Client::connect(b.addr()).await.unwrap();

    // HEAD: headers only, then the connection is still usable.
    let r = c.request("HEAD", "/h", &[], b"").await.unwrap();
    let full_len = "HEAD /h HTTP/1.1\r\nHost: test\r\n\r\n".len();
    assert_eq!(r.header("content-length"), Some(&*full_len.to_string()));
    assert!(r.body.is_empty());

    // Chunked request body is decoded and appended to the head.
    let body = chunked::encode(&[b"abc", b"defg"], &[("X-T", "1")]);
    let r = c
        .request("PUT", "/c", &[("Transfer-Encoding", "chunked")], &body)
        .await
        .unwrap();
    assert!(r
        .body_str()
        .starts_with("PUT /c HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"));
    assert!(r.body_str().ends_with("\r\n\r\nabcdefg"));

    // Two pipelined requests in one write: two responses, in order.
    c.send_raw(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(c
        .read_response(false)
        .await
        .unwrap()
        .body_str()
        .starts_with("GET /1 "));
    assert!(c
        .read_response(false)
        .await
        .unwrap()
        .body_str()
        .starts_with("GET /2 "));

    // Expect: 100-continue gets an interim response before the body is read.
    c.send_raw(b"POST /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        .await
        .unwrap();
    let interim = c.read_response(false).await.unwrap();
    assert_eq!(interim.status, 100);
    c.send_raw(b"ok").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body_str().ends_with("\r\n\r\nok"));
    assert_eq!(b.connections_accepted(), 1);
    assert_eq!(b.requests_served(), 5);
}

#[tokio::test]
async fn echo_honours_connection_close_and_http10() {
    let b = Backend::echo("e");
    let mut c = Client::connect(b.addr()).await.unwrap();
    let r = c
        .request("GET", "/", &[("Connection", "close")], b"")
        .await
        .unwrap();
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed_by_peer().await);

    let mut c = Client::connect(b.addr()).await.unwrap();
    c.send_raw(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed_by_peer().await);

    let mut c = Client::connect(b.addr()).await.unwrap();
    for _ in 0..2 {
        c.send_raw(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let r = c.read_response(false).await.unwrap();
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    assert_eq!(b.connections_accepted(), 3);
}

#[tokio::test]
async fn bad_client_does_not_kill_backend() {
    let b = Backend::echo("e");
    let raw = send_raw_once(b.addr(), b"\x00\x01garbage\r\n\r\n")
        .await
        .unwrap();
    assert!(raw.is_empty());
    let raw = send_raw_once(b.addr(), b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")
        .await
        .unwrap();
    assert!(raw.is_empty());
    let raw = send_raw_once(b.addr(), b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(status_of(&raw), Some(200));
}

#[tokio::test]
async fn fixed_answers_the_same_every_time() {
    let b = Backend::fixed(404, &[("X-A", "1"), ("X-A", "2")], "nope");
    let mut c = Client::connect(b.addr()).await.unwrap();
    for _ in 0..2 {
        let r = c.get("/", "h").await.unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.reason, "Not Found");
        assert_eq!(r.headers_all("x-a"), vec!["1", "2"]);
        assert_eq!(r.header("Content-Length"), Some("4"));
        assert_eq!(r.body_str(), "nope");
    }
    let b = Backend::fixed(204, &[], "ignored");
    let mut c = Client::connect(b.addr()).await.unwrap();
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(r.header("content-length"), None);
    assert!(r.body.is_empty());
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 204);
}

#[tokio::test]
async fn slow_waits_and_counts_in_flight() {
    let b = Backend::slow(Duration::from_millis(300));
    let mut c = Client::connect(b.addr()).await.unwrap();
    let start = Instant::now();
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    let r = c.read_response(false).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.header("x-backend"), Some("slow"));
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);
}

#[tokio::test]
async fn reset_sends_rst() {
    let b = Backend::reset();
    let mut c = Client::connect(b.addr()).await.unwrap();
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let err = c.read_response(false).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(b.requests_served(), 1);
}

#[tokio::test]
async fn close_mid_body_truncates() {
    let b = Backend::close_mid_body();
    let mut c = Client::connect(b.addr()).await.unwrap();
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let err = c.read_response(false).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);

    let raw = send_raw_once(b.addr(), b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
    assert_eq!(&raw[..head.len()], head);
    assert_eq!(&raw[head.len()..], &pattern_vec(100)[..]);
}

#[tokio::test]
async fn chunked_backend_sends_chunks_and_trailer() {
    let b = Backend::chunked(&["hello ", "", "chunked ", "world"]);
    let mut c = Client::connect(b.addr()).await.unwrap();
    for _ in 0..2 {
        let r = c.get("/", "h").await.unwrap();
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r.header("content-length"), None);
        assert_eq!(r.body_str(), "hello chunked world");
        assert_eq!(r.trailer("x-trailer"), Some("done"));
    }
    let raw = send_raw_once(b.addr(), b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(
        &raw[split..],
        b"6\r\nhello \r\n8\r\nchunked \r\n5\r\nworld\r\n0\r\nX-Trailer: done\r\n\r\n"
    );
    // HTTP/1.0 cannot do chunked: close-delimited instead.
    let raw = send_raw_once(b.addr(), b"GET / HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    assert!(raw.ends_with(b"\r\n\r\nhello chunked world"));
}

#[tokio::test]
async fn close_delimited_body_then_close() {
    let b = Backend::close_delimited("until the end");
    let mut c = Client::connect(b.addr()).await.unwrap();
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(r.body_str(), "until the end");
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn huge_body_hash_matches_pattern() {
    let len = 10 * 1024 * 1024 + 123;
    let b = Backend::huge(len);
    let mut c = Client::connect(b.addr()).await.unwrap();
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.header("content-length"), Some(&*len.to_string()));
    assert_eq!(r.body.len() as u64, len);
    assert_eq!(hash_bytes(&r.body), pattern_hash(len));
    let r = c.request("HEAD", "/", &[], b"").await.unwrap();
    assert!(r.body.is_empty());
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn sink_hashes_streamed_bodies() {
    let b = Backend::sink();
    let mut c = Client::connect(b.addr()).await.unwrap();
    let body = pattern_vec(1024 * 1024 + 7);
    let r = c.request("POST", "/", &[], &body).await.unwrap();
    assert_eq!(
        r.body_str(),
        sink_summary(body.len() as u64, hash_bytes(&body))
    );

    let wire = chunked::encode(&[&body[..1000], &body[1000..70_000], &body[70_000..]], &[]);
    let r = c
        .request("POST", "/", &[("Transfer-Encoding", "chunked")], &wire)
        .await
        .unwrap();
    let mut h = Hasher::new();
    h.update(&body);
    assert_eq!(r.body_str(), h.summary());

    let r = c.request("POST", "/", &[], b"").await.unwrap();
    assert_eq!(r.body_str(), Hasher::new().summary());
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn raw_response_is_written_verbatim() {
    let bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
    let b = Backend::raw_response(bytes);
    let raw = send_raw_once(b.addr(), b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .unwrap();
    assert_eq!(raw, bytes);
    assert_eq!(status_of(&raw), Some(200));
}

#[tokio::test]
async fn close_after_each_never_keeps_alive() {
    let b = Backend::close_after_each();
    for i in 1..=2 {
        let mut c = Client::connect(b.addr()).await.unwrap();
        let r = c.get("/", "h").await.unwrap();
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.header("x-backend"), Some("close-after-each"));
        assert!(c.is_closed_by_peer().await);
        assert_eq!(b.connections_accepted(), i);
    }
}

#[tokio::test]
async fn idle_closer_closes_silently_after_n() {
    let b = Backend::idle_closer(2);
    let mut c = Client::connect(b.addr()).await.unwrap();
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.header("connection"), None);
    assert!(!c.is_closed_by_peer_within(Duration::from_millis(50)).await);
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.header("connection"), None);
    assert_eq!(r.header("x-backend"), Some("idle-closer"));
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn hang_never_answers_and_drop_does_not_hang() {
    let b = Backend::hang();
    let mut c = Client::connect(b.addr()).await.unwrap();
    c.set_timeout(Duration::from_millis(200));
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let err = c.read_response(false).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(b.in_flight(), 1);

    // Client closing ends the request.
    drop(c);
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);

    // Dropping a backend with an open, hanging connection is prompt, and the
    // client then sees the connection closed.
    let mut c = Client::connect(b.addr()).await.unwrap();
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    let start = Instant::now();
    drop(b);
    // The request never ends: any bound shows the drop does not wait for it. Generous,
    // so that a loaded machine (the drop joins the backend's thread) stays well inside.
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(c.is_closed_by_peer().await);
}
