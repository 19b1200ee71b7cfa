//! A listener's `min_body_rate`: a request body trickled slower than it is abandoned with
//! 408 once its grace is spent, over HTTP/1.1 and HTTP/2, and its connection's place is
//! free for another client; a steady body at the rate completes. Was (attacker review): a
//! byte every few seconds, within `client_timeout`, held a connection and an upstream
//! connection for as long as the client liked, so a few connections locked a listener out.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{single, Conf, Weir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use weir_testkit::Backend;

/// At least 100 bytes a second after a grace of 1 s; `client_timeout` far longer, so only
/// the rate can end a trickle within the test's bounds.
fn paced(conf: Conf) -> Weir {
    conf.listener("min_body_rate = 100\nmin_body_rate_grace = \"1s\"")
        .listener("client_timeout = \"60s\"\nmax_connections = 1")
        .start()
}

/// Reads what `s` sends until it closes (or 10 s pass).
async fn read_to_close(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got);
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_trickled_http1_body_gets_408_and_frees_its_place() {
    let echo = Backend::echo("e");
    let weir = paced(single(echo.addr()));
    let started = Instant::now();
    let mut slow = TcpStream::connect(weir.addr).await.unwrap();
    slow.write_all(b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut slow).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The listener's one place is free: a new client is served.
    let mut c = weir.client().await;
    assert_eq!(c.get("/next", "h").await.unwrap().status, 200);
}

#[tokio::test]
async fn a_trickled_http2_body_gets_408() {
    let echo = Backend::echo("e");
    let weir = paced(single(echo.addr()));
    let mut h2 = common::h2c_client(weir.addr).await;
    let request = http::Request::post("http://h/up").body(()).unwrap();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(b"a"), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered before client_timeout")
        .expect("a response");
    assert_eq!(response.status(), 408);
}

/// A gRPC streaming call sends a message when the application has one: its body has no
/// rate to keep.
#[tokio::test]
async fn a_grpc_stream_may_be_quiet() {
    let echo = Backend::echo("e");
    let weir = paced(single(echo.addr()));
    let mut h2 = common::h2c_client(weir.addr).await;
    let request = http::Request::post("http://h/svc/Chat")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(b"a"), false)
        .unwrap();
    // Quiet past the grace, and past what one byte earned.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    body.send_data(bytes::Bytes::from_static(b"b"), true)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered")
        .expect("a response");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_steady_body_at_the_rate_completes() {
    let echo = Backend::echo("e");
    let weir = paced(single(echo.addr()));
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 600\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    // 600 bytes over 2.4 s: 250 bytes a second, past the 1 s grace.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        s.write_all(&[b'x'; 100]).await.unwrap();
    }
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(answer.ends_with(&"x".repeat(600)), "the body went up whole");
}

/// A client that sent `Expect: 100-continue` waits for a 100 before its body. An upstream
/// slow to say it: Weir says it after a second of upstream silence, the upstream's own 100
/// after that is not relayed a second time, and the body goes up. Was: an upstream taking
/// longer than the grace to say 100 got its client a 408.
#[tokio::test]
async fn an_upstream_slow_to_say_100_gets_weirs_100_first() {
    let (weir, server) = before_one_connection(async |mut s| {
        let head = read_head(&mut s).await;
        let expects = head.to_ascii_lowercase().contains("expect: 100-continue");
        assert!(expects, "{head}");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n";
        s.write_all(answer.as_bytes()).await.unwrap();
        s.write_all(&body).await.unwrap();
    });
    let started = Instant::now();
    let mut c = expecting(weir.addr, "Connection: close\r\n").await;
    let interim = read_head(&mut c).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    let early = started.elapsed() < Duration::from_millis(2400);
    assert!(early, "Weir's 100, before the upstream's");
    c.write_all(b"hello").await.unwrap();
    let answer = read_to_close(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "one 100: {answer:?}");
    assert!(answer.ends_with("hello"), "{answer:?}");
    server.await.unwrap();
}

/// An upstream that never says 100 and waits for the body (many do) and a client that
/// waits for the 100 before sending it: Weir's 100 ends the wait. Was: each waited for the
/// other until `response_timeout`.
#[tokio::test]
async fn an_upstream_that_never_says_100_does_not_deadlock_a_waiting_client() {
    let (weir, server) = before_one_connection(async |mut s| {
        read_head(&mut s).await;
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        s.write_all(answer.as_bytes()).await.unwrap();
    });
    let answer = body_after_a_100(weir.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    server.await.unwrap();
}

/// The upstream's 100 after Weir's is read and dropped, and its connection is pooled
/// clean: the next request goes over it (the upstream accepts one connection only).
#[tokio::test]
async fn an_upstream_connection_is_reused_after_its_late_100() {
    let (weir, server) = before_one_connection(async |mut s| {
        read_head(&mut s).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        let next = read_head(&mut s).await;
        assert!(next.starts_with("GET /next "), "{next}");
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
            .await
            .unwrap();
    });
    let answer = body_after_a_100(weir.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "one 100: {answer:?}");
    let mut c = weir.client().await;
    let next = c.get("/next", "h").await.unwrap();
    assert_eq!((next.status, next.body.as_slice()), (200, &b"next"[..]));
    server.await.unwrap();
}

/// A client that sent `Expect` but its body without waiting (as curl does after a second)
/// gets no 100 from Weir, however long the upstream takes to answer.
#[tokio::test]
async fn a_client_that_did_not_wait_gets_no_100() {
    let (got_head, head_read) = tokio::sync::oneshot::channel();
    let (weir, server) = before_one_connection(async |mut s| {
        read_head(&mut s).await;
        got_head.send(()).unwrap();
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        s.write_all(answer.as_bytes()).await.unwrap();
    });
    let mut c = expecting(weir.addr, "Connection: close\r\n").await;
    // The body after the head has gone up (not with it): Weir is waiting for the upstream.
    head_read.await.unwrap();
    c.write_all(b"hello").await.unwrap();
    let answer = read_to_close(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "no 100: {answer:?}");
    server.await.unwrap();
}

/// A client that sends `Expect` and then nothing, toward an upstream that never says 100:
/// its wait counts from Weir's 100, so it gets its 408 about a second after the grace, not
/// after `client_timeout` (60 s here).
#[tokio::test]
async fn a_silent_client_with_expect_gets_408_soon_after_weirs_100() {
    silent_after_100_gets_408(false).await;
}

/// Once the client has its 100 (the upstream's here), its wait is its own again: a client
/// that then sends nothing gets the 408 after the grace, not after `client_timeout`.
#[tokio::test]
async fn a_client_told_to_go_on_that_sends_nothing_gets_408_after_the_grace() {
    silent_after_100_gets_408(true).await;
}

/// A client that sends `Expect` and no body gets a 100 (the upstream's if it `says_100`,
/// else Weir's), then its 408 within 10 s, far short of `client_timeout` (60 s).
async fn silent_after_100_gets_408(says_100: bool) {
    let (weir, server) = before_one_connection(async move |mut s| {
        read_head(&mut s).await;
        if says_100 {
            s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        }
        // Holds the connection until Weir gives the request up.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
    });
    let started = Instant::now();
    let mut c = expecting(weir.addr, "").await;
    let interim = read_head(&mut c).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    let answer = read_to_close(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    server.await.unwrap();
}

/// Weir (`paced`) before an upstream that runs `serve` on the one connection it accepts.
fn before_one_connection<F>(
    serve: impl FnOnce(TcpStream) -> F + Send + 'static,
) -> (Weir, JoinHandle<()>)
where
    F: Future<Output = ()> + Send + 'static,
{
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let weir = paced(single(upstream.local_addr().unwrap()));
    upstream.set_nonblocking(true).unwrap();
    let upstream = tokio::net::TcpListener::from_std(upstream).unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = upstream.accept().await.unwrap();
        serve(s).await;
    });
    (weir, server)
}

/// A client that sent a POST head of a 5-byte body with `Expect: 100-continue` (and the
/// fields `more`), and no body yet.
async fn expecting(addr: std::net::SocketAddr, more: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n{more}\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c
}

/// An [`expecting`] client (`Connection: close`) that gets a 100, then sends its body:
/// what follows the 100, to the connection's close.
async fn body_after_a_100(addr: std::net::SocketAddr) -> String {
    let mut c = expecting(addr, "Connection: close\r\n").await;
    let interim = read_head(&mut c).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    c.write_all(b"hello").await.unwrap();
    read_to_close(&mut c).await
}

/// Reads one head (to its blank line) from `s`, byte by byte: nothing after it is taken.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tokio::time::timeout(Duration::from_secs(10), s.read_u8()).await;
        head.push(byte.expect("a head within 10 s").expect("a byte"));
    }
    String::from_utf8_lossy(&head).into_owned()
}
