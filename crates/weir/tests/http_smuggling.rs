//! Strict framing (RFC 9112): every malformed or ambiguous request gets its status, its
//! connection is closed, and it is never forwarded.

mod common;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{split_head, Conf, Weir, WAIT};
use weir_testkit::{send_raw_once, status_of, wait_until_async, Backend, Client};

/// Limits small enough to hit: 4 KiB heads, 20 headers, 1 KiB bodies.
fn strict(backend: &Backend) -> Weir {
    Conf::new()
        .listener(r#"max_header_size = "4KiB""#)
        .listener("max_headers = 20")
        .listener(r#"max_body_size = "1KiB""#)
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &[])
        .start()
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    /// Acceptable statuses (RFC 9112 allows either for some cases).
    statuses: &'static [u16],
}

fn case(name: &'static str, request: impl Into<Vec<u8>>, statuses: &'static [u16]) -> Case {
    Case {
        name,
        request: request.into(),
        statuses,
    }
}

fn cases() -> Vec<Case> {
    let big_value = "v".repeat(5000);
    let many_headers: String = (0..25).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    vec![
        // Content-Length and Transfer-Encoding together, in both orders.
        case(
            "CL and TE",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        case(
            "TE and CL",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        case(
            "CL.TE smuggled request",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 35\r\ntransfer-encoding: CHUNKED\r\n\r\n\
             0\r\n\r\nGET /admin HTTP/1.1\r\nHost: h\r\n\r\n",
            &[400],
        ),
        // Content-Length: duplicated or malformed.
        case(
            "two equal CL",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            &[400],
        ),
        case(
            "two different CL",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            &[400],
        ),
        case("CL +5", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\nhello", &[400]),
        case("CL 5,5", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5,5\r\n\r\nhello", &[400]),
        case("CL 5, 5", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\nhello", &[400]),
        case("CL abc", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n", &[400]),
        case("CL -1", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", &[400]),
        case("CL 0x5", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x5\r\n\r\nhello", &[400]),
        case("CL empty", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n", &[400]),
        case(
            "CL overflow",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            &[400],
        ),
        // Transfer-Encoding other than a lone "chunked".
        case(
            "TE gzip",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
            &[501],
        ),
        case(
            "TE chunked, gzip",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        case(
            "TE gzip, chunked",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        case(
            "TE twice",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        case(
            "chunk extension with an unclosed quoted string",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"x\r\nhello\r\n0\r\n\r\n",
            &[400],
        ),
        case(
            "TE xchunked",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        case(
            "TE in HTTP/1.0",
            "POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        // Header syntax.
        case(
            "obs-fold",
            "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n",
            &[400],
        ),
        case(
            "obs-fold of Content-Length",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n 5\r\n\r\nhello",
            &[400],
        ),
        case(
            "whitespace before the first header",
            "GET / HTTP/1.1\r\n Host: h\r\n\r\n",
            &[400],
        ),
        case(
            "space before colon",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 5\r\n\r\nhello",
            &[400],
        ),
        case(
            "tab before colon",
            "GET / HTTP/1.1\r\nHost: h\r\nX-A\t: b\r\n\r\n",
            &[400],
        ),
        case("space in a header name", "GET / HTTP/1.1\r\nHost: h\r\nX A: b\r\n\r\n", &[400]),
        case("NUL in a header value", "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\0b\r\n\r\n", &[400]),
        case("CR in a header value", "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n\r\n", &[400]),
        // Request line.
        case("invalid method chars", "G@T / HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("method with a slash", "GE/T / HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("target not starting with /", "GET foo HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("target with a space", "GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("double space", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("control char in target", "GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case(
            "absolute form with userinfo",
            "GET http://user@h/ HTTP/1.1\r\nHost: h\r\n\r\n",
            &[400],
        ),
        case("fragment in the target", "GET /a/..#/b HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case(
            "fragment in an absolute-form target",
            "GET http://h/a#b HTTP/1.1\r\nHost: h\r\n\r\n",
            &[400],
        ),
        case("asterisk outside OPTIONS", "GET * HTTP/1.1\r\nHost: h\r\n\r\n", &[400]),
        case("HTTP/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", &[505]),
        case("HTTP/1.2", "GET / HTTP/1.2\r\nHost: h\r\n\r\n", &[505]),
        case("CONNECT", "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n", &[405]),
        // Host.
        case("missing Host in 1.1", "GET / HTTP/1.1\r\nX-A: b\r\n\r\n", &[400]),
        case("two Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &[400]),
        case("Host with a path", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", &[400]),
        case("Host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", &[400]),
        case("Host with userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", &[400]),
        // Limits.
        case(
            "head above max_header_size",
            format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {big_value}\r\n\r\n"),
            &[431],
        ),
        case(
            "more headers than max_headers",
            format!("GET / HTTP/1.1\r\nHost: h\r\n{many_headers}\r\n"),
            &[431],
        ),
        case(
            "CL above max_body_size",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\n\r\n",
            &[413],
        ),
        case(
            "Expect other than 100-continue",
            "GET / HTTP/1.1\r\nHost: h\r\nExpect: something\r\n\r\n",
            &[417],
        ),
    ]
}

#[tokio::test]
async fn malformed_requests_get_their_status_and_are_never_forwarded() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let mut failures = Vec::new();
    for case in cases() {
        let raw = match send_raw_once(weir.addr, &case.request).await {
            Ok(raw) => raw,
            Err(e) => {
                failures.push(format!("{}: no close: {e}", case.name));
                continue;
            }
        };
        let status = status_of(&raw);
        if !status.is_some_and(|s| case.statuses.contains(&s)) {
            failures.push(format!(
                "{}: expected {:?}, got {status:?}: {:?}",
                case.name,
                case.statuses,
                String::from_utf8_lossy(&raw)
            ));
            continue;
        }
        let text = String::from_utf8_lossy(&raw);
        if text.matches("HTTP/1.1 ").count() != 1 || !text.contains("\r\nConnection: close\r\n") {
            failures.push(format!(
                "{}: one response with Connection: close expected: {text:?}",
                case.name
            ));
        }
        if b.requests_served() != 0 {
            failures.push(format!("{}: forwarded to the backend", case.name));
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(b.connections_accepted(), 0);
}

#[tokio::test]
async fn a_well_formed_request_passes_the_same_strict_listener() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let mut c = weir.client().await;
    let r = c
        .request(
            "POST",
            "/ok",
            &[("Host", "h"), ("Content-Length", "1024")],
            &[b'x'; 1024],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let many: Vec<(String, String)> = (0..19)
        .map(|i| (format!("X-H{i}"), i.to_string()))
        .collect();
    let headers: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let r = c.request("GET", "/many", &headers, b"").await.unwrap();
    assert_eq!(r.status, 200, "19 headers + Host = max_headers");
    // `OPTIONS *` parses; it matches no path prefix, so the default response answers it.
    let r = c
        .request("OPTIONS", "*", &[("Host", "h")], b"")
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(c.get("/after", "h").await.unwrap().status, 200);
}

#[tokio::test]
async fn malformed_pipelined_request_after_a_good_one() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let raw = send_raw_once(
        weir.addr,
        b"GET /good HTTP/1.1\r\nHost: h\r\n\r\n\
          POST /bad HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let first = text
        .find("HTTP/1.1 200 OK\r\n")
        .expect("the good request is answered");
    let second = text.find("HTTP/1.1 400 ").expect("then a 400");
    assert!(first < second, "{text}");
    assert_eq!(b.requests_served(), 1);
}

fn chunk_cases() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("non-hex size", b"zz\r\nhello\r\n0\r\n\r\n"),
        ("negative size", b"-1\r\n\r\n0\r\n\r\n"),
        ("empty size", b"\r\nhello\r\n0\r\n\r\n"),
        ("size overflow", b"1ffffffffffffffff\r\nx\r\n0\r\n\r\n"),
        ("data longer than size", b"3\r\nhello\r\n0\r\n\r\n"),
        ("size line without CRLF", b"5\nhello\r\n0\r\n\r\n"),
        ("0x prefix", b"0x5\r\nhello\r\n0\r\n\r\n"),
        ("data not ended by CRLF", b"5\r\nhello\n0\r\n\r\n"),
        ("bare LF in an extension", b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
        ("obs-fold in a trailer", b"0\r\nX-T: a\r\n b\r\n\r\n"),
        // Trailers pass upstream as they came: a line that is no field is refused.
        (
            "a request line as a trailer",
            b"3\r\nabc\r\n0\r\nGET /admin HTTP/1.1\r\n\r\n",
        ),
        ("a space in a trailer's name", b"0\r\nX T: 1\r\n\r\n"),
        ("a trailer without a colon", b"0\r\nX-T 1\r\n\r\n"),
    ]
}

/// The whole malformed body arrives with the head: refused before anything is forwarded.
#[tokio::test]
async fn bad_chunked_bodies_sent_with_the_head_get_400() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    for (name, body) in chunk_cases() {
        let mut request =
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        request.extend_from_slice(body);
        let raw = send_raw_once(weir.addr, &request).await.unwrap();
        assert_eq!(
            status_of(&raw),
            Some(400),
            "{name}: {:?}",
            String::from_utf8_lossy(&raw)
        );
    }
    assert_eq!(b.requests_served(), 0);
}

/// The head was forwarded before the malformed body arrived: the client still gets a 400
/// and its connection closes; the upstream connection is not reused.
#[tokio::test]
async fn bad_chunked_body_after_the_head_was_forwarded() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let mut c = weir.client().await;
    c.send_raw(b"POST /late HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    c.send_raw(b"zz\r\nhello\r\n0\r\n\r\n").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(c.is_closed_by_peer().await);
    // Weir abandoned the upstream connection mid-body.
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);
    let mut c = weir.client().await;
    assert_eq!(c.get("/next", "h").await.unwrap().status, 200);
    assert_eq!(
        b.connections_accepted(),
        2,
        "the half-sent connection was not pooled"
    );
}

#[tokio::test]
async fn chunked_body_above_max_body_size_sent_with_the_head_gets_413() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let mut request = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let data = vec![b'x'; 600];
    request.extend_from_slice(&weir_testkit::chunked::encode(&[&data, &data], &[]));
    let raw = send_raw_once(weir.addr, &request).await.unwrap();
    assert_eq!(
        status_of(&raw),
        Some(413),
        "{:?}",
        String::from_utf8_lossy(&raw)
    );
    assert_eq!(b.requests_served(), 0);
    // Exactly at the limit is fine.
    let mut c = weir.client().await;
    let body = weir_testkit::chunked::encode(&[&data, &data[..424]], &[]);
    let r = c
        .request("POST", "/", &[("Transfer-Encoding", "chunked")], &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
}

/// Once the head has been forwarded, going over max_body_size in a later chunk still
/// answers 413 (the upstream has not answered yet) and closes the connection.
#[tokio::test]
async fn chunked_body_above_max_body_size_after_the_head_was_forwarded() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let mut c = weir.client().await;
    c.send_raw(b"POST /late HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    let data = vec![b'y'; 1000];
    c.send_raw(&weir_testkit::chunked::encode(&[&data], &[])[..1005])
        .await
        .unwrap();
    c.send_raw(b"\r\n3e8\r\n").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 413);
    assert!(c.is_closed_by_peer().await);
    assert!(wait_until_async(WAIT, || b.in_flight() == 0).await);
}

#[tokio::test]
async fn partial_head_gets_408_after_header_timeout() {
    let b = Backend::echo("e");
    let weir = Conf::new()
        .listener(r#"header_timeout = "200ms""#)
        .route("all", "up", &[])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = Client::connect(weir.addr).await.unwrap();
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\nX-Incomplete: ")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 408);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed_by_peer().await);
    assert_eq!(b.requests_served(), 0);
}

#[tokio::test]
async fn partial_second_head_gets_408_after_header_timeout() {
    let b = Backend::echo("e");
    let weir = Conf::new()
        // 1 s: the first request, sent at once, must beat it on a loaded machine too.
        .listener(r#"header_timeout = "1s""#)
        .route("all", "up", &[])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = Client::connect(weir.addr).await.unwrap();
    assert_eq!(c.get("/1", "h").await.unwrap().status, 200);
    c.send_raw(b"GET /2 HTTP/1.1\r\nHo").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 408);
    assert!(c.is_closed_by_peer().await);
    assert_eq!(b.requests_served(), 1);
}

/// A slowloris head whose first byte comes late in the wait for it gets no second
/// `header_timeout`: a connection's first head must be whole within `header_timeout` of
/// the accept (as nginx counts it), whatever it trickles. Such connections keep their
/// place at `max_connections` (a request is in progress), so this is their bound.
#[tokio::test]
async fn a_late_trickled_first_head_ends_at_header_timeout_from_the_accept() {
    let weir = Conf::new()
        // Accepted at the connect, not at the first byte.
        .listener("defer_accept = false\nheader_timeout = \"2s\"")
        .start();
    let started = std::time::Instant::now();
    let tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    // The client's own pace (not a wait for a condition): the first byte after 1.5 s, then
    // a byte every 100 ms. From its first byte, a full header_timeout would end at 3.5 s.
    let trickle = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for b in b"GET / HTTP/1.1\r\nHost: h\r\nX-Slow: abcdefghijklmnopqrstuvwxyz" {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(Ok(n @ 1..)) = tokio::time::timeout(WAIT, rd.read(&mut buf)).await {
        got.extend_from_slice(&buf[..n]);
    }
    let ended = started.elapsed();
    trickle.abort();
    assert_eq!(status_of(&got), Some(408), "{got:?}");
    // 2 s from the accept, with room for a loaded machine; 3.5 s would mean it restarted.
    assert!(
        ended < Duration::from_millis(3200),
        "closed after {ended:?}"
    );
}

#[tokio::test]
async fn silent_connection_is_closed_after_header_timeout() {
    let weir = Conf::new().listener(r#"header_timeout = "200ms""#).start();
    let raw = send_raw_once(weir.addr, b"").await.unwrap();
    // Nothing was asked, so nothing needs answering; what matters is the close.
    assert!(raw.is_empty() || status_of(&raw) == Some(408), "{raw:?}");
}

#[tokio::test]
async fn error_responses_are_well_formed() {
    let b = Backend::echo("e");
    let weir = strict(&b);
    let raw = send_raw_once(weir.addr, b"GET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())),
        "{head}"
    );
    assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
}
