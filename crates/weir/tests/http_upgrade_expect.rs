//! `Expect: 100-continue` and other 1xx relayed from the backend, and `Upgrade` becoming a
//! two-way tunnel after `101 Switching Protocols`.

mod common;

use std::net::SocketAddr;

use common::{single, split_head, upstream_head};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use weir_testkit::{send_raw_once, Backend};

#[tokio::test]
async fn expect_100_continue_is_relayed_before_the_body_is_sent() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(b"POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .await
        .unwrap();
    // Nothing but the head has been sent: the 100 comes from the backend through Weir.
    let interim = c.read_response(false).await.unwrap();
    assert_eq!(interim.status, 100);
    assert!(interim.body.is_empty());
    assert_eq!(b.requests_served(), 1);
    c.send_raw(b"hello").await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    let mut expected = upstream_head(
        "POST /e HTTP/1.1",
        "h",
        "Expect: 100-continue\r\nContent-Length: 5\r\n",
    );
    expected.push_str("hello");
    assert_eq!(r.body_str(), expected);
    // Still keep-alive.
    assert_eq!(c.get("/after", "h").await.unwrap().status, 200);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn expect_100_continue_with_a_chunked_body() {
    let b = Backend::sink();
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(
        b"PUT /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(c.read_response(false).await.unwrap().status, 100);
    c.send_raw(&weir_testkit::chunked::encode(&[b"abc", b"def"], &[]))
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(
        r.body_str(),
        weir_testkit::sink_summary(6, weir_testkit::hash_bytes(b"abcdef"))
    );
}

#[tokio::test]
async fn informational_responses_are_relayed_before_the_final_one() {
    let b = Backend::raw_response(
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let hints = c.read_response(false).await.unwrap();
    assert_eq!(hints.status, 103);
    assert_eq!(hints.header("link"), Some("</style.css>; rel=preload"));
    let r = c.read_response(false).await.unwrap();
    assert_eq!((r.status, &*r.body_str()), (200, "ok"));
}

/// `hints` 103s (`Link: </i>`) then a 200, from an upstream behind a listener with
/// `extra` lines: the status of each response an HTTP/1.1 client reads, in order.
async fn statuses_after_hints(hints: usize, extra: &[&str]) -> Vec<u16> {
    let mut raw = Vec::new();
    for i in 0..hints {
        raw.extend_from_slice(
            format!("HTTP/1.1 103 Early Hints\r\nLink: </{i}>\r\n\r\n").as_bytes(),
        );
    }
    raw.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let b = Backend::raw_response(&raw);
    let mut conf = single(b.addr());
    for line in extra {
        conf = conf.listener(line);
    }
    let weir = conf.start();
    let mut c = weir.client().await;
    c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let mut statuses = Vec::new();
    loop {
        let r = c.read_response(false).await.unwrap();
        statuses.push(r.status);
        if r.status >= 200 {
            assert_eq!(b.requests_served(), 1, "retried");
            return statuses;
        }
    }
}

/// An upstream may send `max_informational` 1xx heads (default 8) before its final
/// response; one more and the client, which has the ones relayed, gets 502 (1xx commit no
/// status), without a retry.
#[tokio::test]
async fn informational_responses_past_max_informational_are_502() {
    let eight = statuses_after_hints(8, &[]).await;
    assert_eq!(eight, [[103; 8].as_slice(), &[200]].concat());
    let nine = statuses_after_hints(9, &[]).await;
    assert_eq!(nine, [[103; 8].as_slice(), &[502]].concat());
    let three = statuses_after_hints(3, &["max_informational = 2"]).await;
    assert_eq!(three, [103, 103, 502]);
}

#[tokio::test]
async fn informational_responses_are_not_sent_to_http10_clients() {
    let b = Backend::raw_response(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let weir = single(b.addr()).start();
    let raw = send_raw_once(weir.addr, b"GET / HTTP/1.0\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, b"ok");
}

/// A WebSocket-ish backend on the test runtime: reads the upgrade request head, answers
/// 101, then echoes every byte back prefixed by nothing (a plain byte echo) until EOF.
/// Returns its address and a handle yielding the request head it received.
async fn upgrade_backend() -> (SocketAddr, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "EOF inside the upgrade request head");
            got.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        )
        .await
        .unwrap();
        // Bytes that arrived right behind the head belong to the tunnel.
        if got.len() > end {
            s.write_all(&got[end..]).await.unwrap();
        }
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        head
    });
    (addr, task)
}

/// Reads exactly `n` bytes (bounded by the harness wait).
async fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    tokio::time::timeout(common::WAIT, s.read_exact(&mut out))
        .await
        .expect("bytes through the tunnel in time")
        .expect("read");
    out
}

/// Reads a response head byte by byte (so no tunnel bytes are consumed with it).
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let b = read_exact(s, 1).await;
        head.extend_from_slice(&b);
    }
    String::from_utf8(head).unwrap()
}

const UPGRADE_REQUEST: &[u8] = b"GET /chat HTTP/1.1\r\nHost: h\r\n\
    Connection: Upgrade\r\nUpgrade: websocket\r\n\
    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

#[tokio::test]
async fn upgrade_becomes_a_two_way_tunnel_after_101() {
    let (addr, backend) = upgrade_backend().await;
    let weir = single(addr).start();
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(UPGRADE_REQUEST).await.unwrap();
    let head = read_head(&mut s).await;
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(
        head.contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
        "{head}"
    );

    // Bytes flow both ways, several times, including binary.
    for msg in [&b"ping"[..], b"\x81\x05hello", &[0u8, 255, 13, 10, 13, 10]] {
        s.write_all(msg).await.unwrap();
        assert_eq!(read_exact(&mut s, msg.len()).await, msg);
    }
    let big = weir_testkit::pattern_vec(300_000);
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(&big).await.unwrap();
    };
    let read = async {
        let mut got = vec![0u8; big.len()];
        tokio::time::timeout(common::WAIT, r.read_exact(&mut got))
            .await
            .expect("in time")
            .expect("read");
        got
    };
    let ((), got) = tokio::join!(write, read);
    assert_eq!(
        weir_testkit::hash_bytes(&got),
        weir_testkit::hash_bytes(&big)
    );

    // Closing the client side ends the tunnel and the backend sees EOF.
    drop(s);
    let upstream_head = tokio::time::timeout(common::WAIT, backend)
        .await
        .expect("the backend saw the tunnel close")
        .unwrap();
    assert!(
        upstream_head.starts_with("GET /chat HTTP/1.1\r\nHost: h\r\n"),
        "{upstream_head}"
    );
    let lower = upstream_head.to_ascii_lowercase();
    assert!(
        lower.contains("\r\nconnection: upgrade\r\n"),
        "{upstream_head}"
    );
    assert!(
        lower.contains("\r\nupgrade: websocket\r\n"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains("\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains("\r\nX-Forwarded-For: 127.0.0.1\r\n"),
        "{upstream_head}"
    );
}

#[tokio::test]
async fn bytes_sent_right_behind_the_upgrade_request_reach_the_backend() {
    let (addr, _backend) = upgrade_backend().await;
    let weir = single(addr).start();
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    let mut bytes = UPGRADE_REQUEST.to_vec();
    bytes.extend_from_slice(b"early");
    s.write_all(&bytes).await.unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert_eq!(read_exact(&mut s, 5).await, b"early");
    s.write_all(b"late").await.unwrap();
    assert_eq!(read_exact(&mut s, 4).await, b"late");
}

#[tokio::test]
async fn upgrade_refused_by_the_backend_is_an_ordinary_response() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(UPGRADE_REQUEST).await.unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert!(
        body.starts_with("GET /chat HTTP/1.1\r\nHost: h\r\n"),
        "{body}"
    );
    // The connection is still HTTP: another request works.
    let r = c.get("/after", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), upstream_head("GET /after HTTP/1.1", "h", ""));
}

/// An upgrade request and what the upstream must see of it.
struct Offer {
    name: &'static str,
    /// Extra route keys.
    route: &'static [&'static str],
    request: &'static str,
    /// The `Upgrade` line the upstream gets (None: no Upgrade, no `Connection: upgrade`).
    forwarded: Option<&'static str>,
}

/// Upgrades the route does not allow are stripped: h2c above all (issue 17: with h2c
/// forwarded and a 101 tunnelled, a client speaks HTTP/2 to the backend past the routes).
fn offers() -> Vec<Offer> {
    let case = |name, route, request, forwarded| Offer {
        name,
        route,
        request,
        forwarded,
    };
    vec![
        case(
            "h2c, as curl --http2 sends it",
            &[],
            "GET /x HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n\
             Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
            None,
        ),
        case(
            "h2c with HTTP2-Settings not named by Connection",
            &[],
            "GET /x HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: H2C\r\n\
             HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
            None,
        ),
        case(
            "h2c offered next to websocket",
            &[],
            "GET /x HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: h2c, WebSocket\r\n\r\n",
            Some("Upgrade: WebSocket"),
        ),
        case(
            "websocket on a route with upgrades = []",
            &["upgrades = []"],
            "GET /x HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            None,
        ),
        case(
            "a protocol the route allows, with its version",
            &[r#"upgrades = ["websocket", "Foo"]"#],
            "GET /x HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: foo/2, bar\r\n\r\n",
            Some("Upgrade: foo/2"),
        ),
        case(
            "HTTP/1.0 (its Upgrade is ignored)",
            &[],
            "GET /x HTTP/1.0\r\nHost: h\r\nConnection: keep-alive, upgrade\r\nUpgrade: websocket\r\n\r\n",
            None,
        ),
    ]
}

#[tokio::test]
async fn upgrades_the_route_does_not_allow_are_not_forwarded() {
    let b = Backend::echo("e");
    for case in offers() {
        let name = case.name;
        let weir = common::Conf::new()
            .route("all", "up", case.route)
            .upstream("up", &[b.addr()], &[])
            .start();
        let mut c = weir.client().await;
        c.send_raw(case.request.as_bytes()).await.unwrap();
        let r = c.read_response(false).await.unwrap();
        assert_eq!(r.status, 200, "{name}");
        let seen = r.body_str().to_ascii_lowercase();
        assert!(!seen.contains("h2c"), "{name}: {seen}");
        assert!(!seen.contains("http2-settings"), "{name}: {seen}");
        match case.forwarded {
            Some(line) => {
                assert!(
                    r.body_str().contains(&format!("\r\n{line}\r\n")),
                    "{name}: {seen}"
                );
                assert!(
                    seen.contains("\r\nconnection: upgrade\r\n"),
                    "{name}: {seen}"
                );
            }
            None => {
                assert!(!seen.contains("upgrade"), "{name}: {seen}");
            }
        }
        // Not tunnelled: the connection still speaks HTTP.
        let r = c.get("/after", "h").await.unwrap();
        assert_eq!(
            r.body_str(),
            upstream_head("GET /after HTTP/1.1", "h", ""),
            "{name}"
        );
    }
}

/// Upstreams that answer 101 to something the client did not get to offer them.
#[tokio::test]
async fn a_101_to_a_protocol_not_offered_is_never_tunnelled() {
    let h2c = "GET /x HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n\
               Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";
    let ws = std::str::from_utf8(UPGRADE_REQUEST).unwrap();
    let plain = "GET /x HTTP/1.1\r\nHost: h\r\n\r\n";
    let to_h2c = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    let to_ws =
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let no_protocol = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n";
    let cases = [
        ("h2c request answered 101 h2c", h2c, to_h2c),
        ("h2c request answered 101 websocket", h2c, to_ws),
        ("websocket request answered 101 h2c", ws, to_h2c),
        (
            "websocket request answered 101 without Upgrade",
            ws,
            no_protocol,
        ),
        ("plain request answered 101 websocket", plain, to_ws),
    ];
    for (name, request, answer) in cases {
        // The HTTP/2 server preface right behind the 101, as an h2c server sends it.
        let mut response = answer.as_bytes().to_vec();
        response.extend_from_slice(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
        let b = Backend::raw_response(&response);
        let weir = single(b.addr()).start();
        let mut c = weir.client().await;
        c.send_raw(request.as_bytes()).await.expect("request");
        let r = c.read_response(false).await.expect("answer");
        assert_eq!(r.status, 502, "{name}");
        assert_eq!(r.body, b"Bad Gateway\n", "{name}");
        // Nothing was tunnelled: the connection (the request was read whole, so it is
        // kept after the 502) still carries HTTP/1.1 requests.
        assert_eq!(r.header("connection"), None, "{name}");
        c.send_raw(plain.as_bytes()).await.expect("request");
        let r = c.read_response(false).await.expect("answer");
        assert_eq!(r.status, 502, "{name}: the next request");
    }
}

/// An upgrade request that declares a body it never sends, to WebSocket servers that
/// answer 101 on the head: the 101 cannot be tunnelled (the body would be lost in the
/// tunnel), so 502, but the client provoked that answer and it must not count against
/// the server (attack review item 1b). After two on three servers (`max_fails = 1`),
/// ordinary requests still reach all three.
#[tokio::test]
async fn a_101_before_the_request_body_does_not_eject_the_server() {
    use weir_testkit::WsBackend;
    let backends = [WsBackend::echo(), WsBackend::echo(), WsBackend::echo()];
    let addrs: Vec<_> = backends.iter().map(WsBackend::addr).collect();
    let weir = common::Conf::new()
        .route("all", "up", &[])
        .upstream("up", &addrs, &common::EJECT_AT_FIRST_FAILURE)
        .start();
    let request = b"GET /chat HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
        Content-Length: 10\r\n\r\n";
    for _ in 0..2 {
        let mut c = weir.client().await;
        c.send_raw(request).await.expect("request");
        let r = c.read_response(false).await.expect("answer");
        assert_eq!(r.status, 502);
    }
    let heads = || backends.iter().map(|b| b.heads().len()).collect::<Vec<_>>();
    // A head is noted before its answer is written: the client has the 502 after it.
    let before = heads();
    assert_eq!(before.iter().sum::<usize>(), 2, "{before:?}");
    // Ordinary requests (not upgrades: the WebSocket server answers them 400).
    let mut c = weir.client().await;
    for _ in 0..6 {
        let r = c.get("/", "h").await.expect("response");
        assert_eq!(r.status, 400);
    }
    let after = heads();
    common::assert_each_took(&before, &after, 2);
}
