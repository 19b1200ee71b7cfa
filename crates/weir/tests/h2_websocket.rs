//! WebSocket over HTTP/2 (RFC 8441): an h2 client (the `h2` crate's, which sends extended
//! CONNECT once the server allowed it with SETTINGS_ENABLE_CONNECT_PROTOCOL) talks to a
//! WebSocket echo backend on HTTP/1.1 (`weir_testkit::WsBackend`) through Weir.

mod common;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::ext::Protocol;
use h2::{Reason, RecvStream, SendStream};
use http::{Method, Request, StatusCode};
use tokio::net::TcpStream;

use common::{single, Weir, WAIT};
use weir_testkit::ws_backend::{parse_frame, ws_frame, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};
use weir_testkit::{wait_until_async, Backend, WsBackend};

/// An h2c connection whose server has enabled extended CONNECT.
async fn connect(addr: std::net::SocketAddr) -> SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    // The flag arrives with the server's SETTINGS; the client must have seen them.
    let mut client = client.ready().await.expect("ready");
    assert!(
        wait_until_async(WAIT, || client.is_extended_connect_protocol_enabled()).await,
        "SETTINGS_ENABLE_CONNECT_PROTOCOL"
    );
    client = client.ready().await.expect("ready");
    client
}

fn extended_connect(path: &str, protocol: &'static str) -> Request<()> {
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(format!("http://example.test{path}"))
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat, superchat")
        .body(())
        .expect("request");
    req.extensions_mut().insert(Protocol::from_static(protocol));
    req
}

/// Reads DATA until one whole WebSocket frame is there.
async fn next_frame(body: &mut RecvStream, buf: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    loop {
        if let Some((op, payload, used)) = parse_frame(buf) {
            buf.drain(..used);
            return Some((op, payload));
        }
        let chunk = tokio::time::timeout(WAIT, body.data()).await.ok()??.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
    }
}

/// The status an extended CONNECT for `path` and `protocol` gets.
async fn status_of(
    client: &mut SendRequest<Bytes>,
    path: &str,
    protocol: &'static str,
) -> StatusCode {
    let (response, _up) = client
        .send_request(extended_connect(path, protocol), false)
        .expect("send");
    response.await.expect("response").status()
}

/// Sends an extended CONNECT for `path` (`websocket`) and waits for its response.
async fn tunnel_response(
    client: &mut SendRequest<Bytes>,
    path: &str,
) -> (http::Response<RecvStream>, SendStream<Bytes>) {
    let (response, up) = client
        .send_request(extended_connect(path, "websocket"), false)
        .expect("extended CONNECT");
    let response = tokio::time::timeout(WAIT, response)
        .await
        .expect("in time")
        .expect("response");
    (response, up)
}

async fn send(stream: &mut SendStream<Bytes>, frame: Vec<u8>, end: bool) {
    stream.send_data(Bytes::from(frame), end).expect("send");
}

#[tokio::test]
async fn websocket_echo_over_http2_extended_connect() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    let (response, mut up) = tunnel_response(&mut client, "/chat?room=1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["sec-websocket-protocol"], "chat");
    // The 101's end-to-end fields pass; its accept (for Weir's key) and hop-by-hop do not.
    assert_eq!(response.headers()["set-cookie"], "ws=1");
    for name in ["sec-websocket-accept", "upgrade", "connection"] {
        assert!(!response.headers().contains_key(name), "{name}");
    }
    // The upstream got an HTTP/1.1 Upgrade with a key Weir made.
    let heads = backend.heads();
    assert_eq!(heads.len(), 1);
    let head = heads[0].to_ascii_lowercase();
    assert!(head.starts_with("get /chat?room=1 http/1.1\r\n"), "{head}");
    assert!(head.contains("upgrade: websocket\r\n"), "{head}");
    assert!(head.contains("sec-websocket-version: 13\r\n"), "{head}");
    let key = head
        .lines()
        .find_map(|l| l.strip_prefix("sec-websocket-key: "))
        .expect("a key");
    assert_eq!(key.len(), 24, "{key}");

    let mut body = response.into_body();
    let mut buf = Vec::new();
    // Text both ways, a large one under flow control, a ping.
    let big = vec![b'x'; 300_000];
    for (op, payload) in [
        (OP_TEXT, &b"hello"[..]),
        (OP_TEXT, &big[..]),
        (OP_PING, b"p"),
    ] {
        up.reserve_capacity(payload.len() + 14);
        send(&mut up, ws_frame(op, payload, Some([9, 8, 7, 6])), false).await;
        let want = if op == OP_PING { OP_PONG } else { op };
        let got = next_frame(&mut body, &mut buf).await.expect("echo");
        assert_eq!((got.0, got.1.len()), (want, payload.len()));
        assert_eq!(got.1, payload);
    }
    // Close: the server echoes CLOSE and ends; Weir ends the stream.
    send(
        &mut up,
        ws_frame(OP_CLOSE, b"\x03\xe8", Some([1, 1, 1, 1])),
        true,
    )
    .await;
    let got = next_frame(&mut body, &mut buf).await.expect("close");
    assert_eq!(got, (OP_CLOSE, b"\x03\xe8".to_vec()));
    // Then END_STREAM (an empty DATA frame carries it), nothing more.
    let mut rest = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await.expect("end") {
        rest.extend_from_slice(&chunk.expect("data"));
    }
    assert!(rest.is_empty(), "{rest:?}");
    assert!(wait_until_async(WAIT, || backend.ended() == 1).await);
    // The stream is counted once its task ends, after the END_STREAM was sent: poll.
    let counted = || {
        let text = weir.metrics_text();
        text.contains("code=\"200\",protocol=\"HTTP/2.0\"} 1")
    };
    assert!(
        wait_until_async(WAIT, counted).await,
        "{}",
        weir.metrics_text()
    );
}

#[tokio::test]
async fn a_client_reset_closes_the_upstream_websocket() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    let (response, mut up) = client
        .send_request(extended_connect("/chat", "websocket"), false)
        .expect("extended CONNECT");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(backend.upgraded(), 1);
    up.send_reset(Reason::CANCEL);
    assert!(
        wait_until_async(WAIT, || backend.ended() == 1).await,
        "the upstream connection was closed"
    );
}

#[tokio::test]
async fn refused_upgrades_keep_their_status_and_reach_no_tunnel() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    // The upstream's refusal comes back with its status.
    assert_eq!(
        status_of(&mut client, "/refuse", "websocket").await,
        StatusCode::FORBIDDEN
    );
    // A protocol other than websocket: 501, nothing upstream.
    assert_eq!(
        status_of(&mut client, "/x", "chat-over-h2").await,
        StatusCode::NOT_IMPLEMENTED
    );
    assert_eq!(backend.heads().len(), 1, "only /refuse went upstream");
    assert_eq!(backend.upgraded(), 0);
}

#[tokio::test]
async fn a_route_without_websocket_in_upgrades_refuses_it() {
    let backend = Backend::echo("up");
    let weir = common::Conf::new()
        .route("all", "up", &["upgrades = []"])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let mut client = connect(weir.addr).await;
    assert_eq!(
        status_of(&mut client, "/chat", "websocket").await,
        StatusCode::NOT_IMPLEMENTED
    );
    assert_eq!(backend.requests_served(), 0);
}

/// A server that answers 101 with a wrong Sec-WebSocket-Accept is no WebSocket: 502.
#[tokio::test]
async fn a_bad_accept_is_a_502() {
    let backend = Backend::raw_response(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
          sec-websocket-accept: d3Jvbmc=\r\n\r\n",
    );
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    assert_eq!(
        status_of(&mut client, "/chat", "websocket").await,
        StatusCode::BAD_GATEWAY
    );
}

/// Resetting an established tunnel is how a client closes it (RFC 8441): no cancelled
/// request, so it is not charged to the reset budget. Past `reset_budget` such closes, the
/// connection still opens tunnels.
#[tokio::test]
async fn closing_tunnels_with_resets_is_not_charged_to_the_reset_budget() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr())
        .listener("http2 = { reset_budget = 2, reset_window = \"60s\" }")
        .start();
    let mut client = connect(weir.addr).await;
    for i in 1..=5 {
        let (response, mut up) = tunnel_response(&mut client, "/chat").await;
        assert_eq!(response.status(), StatusCode::OK, "tunnel {i}");
        up.send_reset(Reason::CANCEL);
        assert!(wait_until_async(WAIT, || backend.ended() == i).await);
        client = client.ready().await.expect("ready");
    }
    let text = weir.metrics_text();
    for name in ["client_resets", "calm_goaways"] {
        let line = format!("weir_http2_{name}_total{{listener=\"web\"}} 0");
        assert!(text.contains(&line), "{name}: {text}");
    }
}

/// A refusal is relayed as any response: a 401 with its WWW-Authenticate and body, a
/// redirect with its Location; a 2xx that is not a 101 is no WebSocket server: 502.
#[tokio::test]
async fn refusals_keep_their_fields_and_body_and_a_2xx_is_a_502() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    let (response, _up) = client
        .send_request(extended_connect("/refuse-auth", "websocket"), false)
        .expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"ws\""
    );
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await.expect("body") {
        got.extend_from_slice(&chunk.expect("data"));
    }
    assert_eq!(got, b"login first");

    let redirect = Backend::raw_response(
        b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n",
    );
    let weir = single(redirect.addr()).start();
    let mut client = connect(weir.addr).await;
    let (response, _up) = client
        .send_request(extended_connect("/chat", "websocket"), false)
        .expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::FOUND);
    assert_eq!(response.headers()["location"], "/elsewhere");

    let ok = Backend::raw_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi");
    let weir = single(ok.addr()).start();
    let mut client = connect(weir.addr).await;
    assert_eq!(
        status_of(&mut client, "/chat", "websocket").await,
        StatusCode::BAD_GATEWAY
    );
}

/// An `auto` upstream (over TLS: it may speak HTTP/2) still gets the WebSocket as an
/// HTTP/1.1 Upgrade (on a connection made with ALPN `http/1.1`); the HTTP/2-only ones
/// (`h2`, `h2c`) refuse it with 501 without reaching a server: trying HTTP/1.1 on an
/// h2-only server would count its refusal as the server's failure, and anyone could eject
/// the pool's servers that way. (The test server is an HTTP/1.1 echo: its 200 is no
/// switch, so the client gets 502, after the request went upstream.)
#[tokio::test]
async fn websockets_go_over_http1_to_auto_upstreams_and_not_to_http2_only_ones() {
    use weir_testkit::certs::TestCa;
    use weir_testkit::TlsServer;
    let ca = TestCa::new("ws upstream CA");
    let leaf = ca.leaf(&["127.0.0.1"]);
    let tls = format!("tls = {{ ca = \"{}\" }}", ca.cert_path.display());
    let cases = [
        ("auto", StatusCode::BAD_GATEWAY, 1),
        ("h2", StatusCode::NOT_IMPLEMENTED, 0),
    ];
    for (protocol, status, served) in cases {
        let backend = Backend::echo_tls("h1", &TlsServer::new(&leaf));
        let keys = [format!("protocol = \"{protocol}\""), tls.clone()];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let weir = common::Conf::new()
            .route("all", "up", &[])
            .upstream("up", &[backend.addr()], &keys)
            .start();
        let mut client = connect(weir.addr).await;
        assert_eq!(
            status_of(&mut client, "/chat", "websocket").await,
            status,
            "{protocol}"
        );
        assert_eq!(backend.requests_served(), served, "{protocol}");
    }
    let backend = Backend::echo("h2c");
    let weir = common::Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .start();
    let mut client = connect(weir.addr).await;
    assert_eq!(
        status_of(&mut client, "/chat", "websocket").await,
        StatusCode::NOT_IMPLEMENTED
    );
    assert_eq!(backend.requests_served(), 0);
}

/// Opens a tunnel on `weir`: the connection's handle (kept by the caller so the connection
/// stays), and the tunnel's two halves.
async fn open_tunnel(weir: &common::Weir) -> (SendRequest<Bytes>, SendStream<Bytes>, RecvStream) {
    let mut client = connect(weir.addr).await;
    let (response, up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(response.status(), StatusCode::OK);
    (client, up, response.into_body())
}

/// Waits for the tunnel's stream to end (a reset or END_STREAM), with no data first.
async fn ended_by_weir(body: &mut RecvStream) {
    let next = tokio::time::timeout(WAIT, body.data()).await;
    match next.expect("weir ended the still tunnel") {
        None | Some(Err(_)) => {}
        Some(Ok(data)) => panic!("unexpected data {data:?}"),
    }
}

/// A text frame through the tunnel (with END_STREAM if `end`) and its echo back.
async fn echo_once(up: &mut SendStream<Bytes>, body: &mut RecvStream, text: &[u8], end: bool) {
    send(up, ws_frame(OP_TEXT, text, Some([1, 2, 3, 4])), end).await;
    let got = next_frame(body, &mut Vec::new()).await.expect("echo");
    assert_eq!(got, (OP_TEXT, text.to_vec()));
}

/// The tunnel's request was recorded with its 200 and not as an aborted response: a still
/// tunnel just ends, neither side is to blame (no `client_timeout`).
async fn recorded_without_abort(weir: &Weir) {
    let recorded = || {
        let text = weir.metrics_text();
        let mut lines = text.lines();
        lines.any(|l| l.starts_with("weir_requests_total{") && l.contains("code=\"200\""))
    };
    assert!(
        wait_until_async(WAIT, recorded).await,
        "the tunnel was recorded"
    );
    let text = weir.metrics_text();
    assert!(!text.contains("weir_responses_aborted_total{"), "{text}");
}

/// A tunnel where nothing moves for `tunnel_idle_timeout` is ended both ways. (No echo
/// first: its round trip would race the short bound; the 200 proves the tunnel.)
#[tokio::test]
async fn an_idle_rfc_8441_tunnel_is_ended_after_tunnel_idle_timeout() {
    let backend = WsBackend::echo();
    let conf = single(backend.addr()).listener("tunnel_idle_timeout = \"300ms\"");
    let weir = conf.start();
    let (_client, _up, mut body) = open_tunnel(&weir).await;
    ended_by_weir(&mut body).await;
    assert!(wait_until_async(WAIT, || backend.ended() == 1).await);
    assert_eq!(weir.tunnel_timeouts(), (1, 0));
    recorded_without_abort(&weir).await;
}

/// After the client's END_STREAM, an upstream that stays silent (and open) is cut after
/// `tunnel_fin_timeout`, well before the idle bound.
#[tokio::test]
async fn a_half_closed_rfc_8441_tunnel_is_ended_after_tunnel_fin_timeout() {
    let backend = WsBackend::holding();
    let conf = single(backend.addr()).listener("tunnel_fin_timeout = \"300ms\"");
    let weir = conf.start();
    let (_client, mut up, mut body) = open_tunnel(&weir).await;
    // The echo first, then END_STREAM: the fin bound starts only once the echo is back.
    echo_once(&mut up, &mut body, b"bye", false).await;
    send(&mut up, Vec::new(), true).await;
    assert!(wait_until_async(WAIT, || backend.client_ends() == 1).await);
    ended_by_weir(&mut body).await;
    assert_eq!(weir.tunnel_timeouts(), (0, 1));
    recorded_without_abort(&weir).await;
}

/// A handshake whose first server refuses the connection is tried on the next one (nothing
/// was sent, so it is a retry like any request's), and the tunnel works there.
#[tokio::test]
async fn a_refused_handshake_is_retried_on_another_server() {
    let backend = WsBackend::echo();
    let dead = common::dead_port();
    let retry = [
        "[upstreams.up.retry]",
        "attempts = 1",
        "on = [\"connect_error\"]",
        "[upstreams.up.passive]",
        "max_fails = 0",
    ];
    let weir = common::Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[dead.addr, backend.addr()], &retry)
        .start();
    let mut client = connect(weir.addr).await;
    // Round robin: the first handshake goes to the dead server first (so may the second:
    // the retry's pick moves the round on).
    for round in 0..2 {
        let (response, mut up) = tunnel_response(&mut client, "/chat").await;
        assert_eq!(response.status(), StatusCode::OK, "round {round}");
        let mut body = response.into_body();
        echo_once(&mut up, &mut body, b"hi", false).await;
    }
    assert_eq!(backend.heads().len(), 2);
    assert!(weir.metric("weir_upstream_retries_total{upstream=\"up\"}") >= 1);
}

/// A WebSocket handshake the client sends to a path whose server is no WebSocket server
/// (it answers 200) gets 502, but does not count against that server: passive health
/// would otherwise let any client eject healthy servers, one request each (attack review
/// item 1a). After two such requests on three servers (`max_fails = 1`), ordinary
/// requests still reach all three.
#[tokio::test]
async fn a_2xx_to_a_websocket_handshake_does_not_eject_the_server() {
    let backends = [Backend::echo("a"), Backend::echo("b"), Backend::echo("c")];
    let addrs: Vec<_> = backends.iter().map(Backend::addr).collect();
    let weir = common::Conf::new()
        .route("all", "up", &[])
        .upstream("up", &addrs, &common::EJECT_AT_FIRST_FAILURE)
        .start();
    let mut client = connect(weir.addr).await;
    for _ in 0..2 {
        let status = status_of(&mut client, "/anything", "websocket").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
    }
    let served = || {
        backends
            .iter()
            .map(Backend::requests_served)
            .collect::<Vec<_>>()
    };
    // Counted when the head is read: before the client has an answer.
    let before = served();
    assert_eq!(before.iter().sum::<usize>(), 2, "{before:?}");
    let mut h1 = weir.client().await;
    for _ in 0..6 {
        let r = h1.get("/", "example.test").await.expect("response");
        assert_eq!(r.status, 200);
    }
    let after = served();
    common::assert_each_took(&before, &after, 2);
}

/// One HTTP/2 connection holds at most `http2.max_tunnels` WebSocket tunnels (each is an
/// upstream connection of its own): the next extended CONNECT gets 429 without reaching
/// the upstream, ordinary streams still pass, and once a tunnel ends a new one is
/// accepted (attack review item 2).
#[tokio::test]
async fn tunnels_past_max_tunnels_get_429_until_one_ends() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr())
        .listener("http2 = { max_tunnels = 2 }")
        .start();
    let mut client = connect(weir.addr).await;
    let (first, mut first_up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(first.status(), StatusCode::OK);
    let (second, _second_up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(second.status(), StatusCode::OK);
    let (refused, _up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut body = refused.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await.expect("body") {
        text.extend_from_slice(&chunk.expect("data"));
    }
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("too many WebSocket tunnels"), "{text}");
    assert_eq!(backend.heads().len(), 2, "the refused one went upstream");
    // An ordinary request on the same connection (the WebSocket server answers it 400).
    let get = Request::get("http://example.test/plain").body(()).unwrap();
    let (response, _) = client.send_request(get, true).expect("GET");
    let response = tokio::time::timeout(WAIT, response).await.expect("in time");
    assert_eq!(
        response.expect("response").status(),
        StatusCode::BAD_REQUEST
    );
    // One tunnel ends: its place is free again.
    first_up.send_reset(Reason::CANCEL);
    assert!(wait_until_async(WAIT, || backend.ended() == 1).await);
    client = client.ready().await.expect("ready");
    let (again, _again_up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(backend.upgraded(), 3);
}

/// A plain CONNECT (`:authority` only, no `:protocol`) is refused with 405 as over
/// HTTP/1.1 (docs/http2.md), not reset as malformed; nothing goes upstream and the
/// connection goes on (attack review item 7).
#[tokio::test]
async fn a_plain_connect_gets_405() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let mut client = connect(weir.addr).await;
    let plain = Request::builder()
        .method(Method::CONNECT)
        .uri("example.test:443")
        .body(())
        .expect("request");
    let (response, _up) = client.send_request(plain, false).expect("CONNECT");
    let response = tokio::time::timeout(WAIT, response).await.expect("in time");
    let response = response.expect("a response, not a reset");
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(backend.heads().len(), 0);
    client = client.ready().await.expect("ready");
    let (tunnel, _up) = tunnel_response(&mut client, "/chat").await;
    assert_eq!(tunnel.status(), StatusCode::OK);
}
