//! A listener's `min_body_rate`: a request body trickled slower than it is abandoned with
//! 408 once its grace is spent, over HTTP/1.1 and HTTP/2, and its connection's place is
//! free for another client; a steady body at the rate completes. Was (attacker review): a
//! byte every few seconds, within `client_timeout`, held a connection and an upstream
//! connection for as long as the client liked, so a few connections locked a listener out.

mod common;

use std::time::{Duration, Instant};

use common::{single, Conf, Weir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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

/// A client that sent `Expect: 100-continue` waits for the upstream's 100 before its body:
/// that wait is the upstream's, not the client's pace. Was: an upstream taking longer than
/// the grace to say 100 got its client a 408.
#[tokio::test]
async fn a_wait_for_the_upstreams_100_is_not_held_against_the_client() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let weir = paced(single(upstream.local_addr().unwrap()));
    let server = tokio::spawn(async move {
        let (mut s, _) = upstream.accept().await.unwrap();
        let head = read_head(&mut s).await;
        assert!(
            head.to_ascii_lowercase().contains("expect: 100-continue"),
            "{head}"
        );
        // Longer than the 1 s grace before the 100.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&body).await.unwrap();
    });
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\
          Connection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let interim = read_head(&mut c).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    c.write_all(b"hello").await.unwrap();
    let answer = read_to_close(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(answer.ends_with("hello"), "{answer:?}");
    server.await.unwrap();
}

/// Once the client has its 100, its wait is its own again: a client that then sends
/// nothing gets the 408 after the grace, not after `client_timeout` (60 s here).
#[tokio::test]
async fn a_client_told_to_go_on_that_sends_nothing_gets_408_after_the_grace() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let weir = paced(single(upstream.local_addr().unwrap()));
    let server = tokio::spawn(async move {
        let (mut s, _) = upstream.accept().await.unwrap();
        read_head(&mut s).await;
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        // Holds the connection until Weir gives the request up.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
    });
    let started = Instant::now();
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let interim = read_head(&mut c).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    let answer = read_to_close(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    server.await.unwrap();
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
