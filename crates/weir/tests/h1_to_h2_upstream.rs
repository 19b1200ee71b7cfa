//! HTTP/1.x clients to HTTP/2 upstreams (`protocol = "h2c"` / `"h2"`): the request is
//! translated to HTTP/2 and the response back, over real sockets, against weir-testkit's
//! `H2Backend` (an h2 echo server): connection-specific fields, `TE: trailers` and
//! trailers, chunked and Content-Length bodies under flow control, a response whose DATA
//! does not match its length, HEAD, 1xx, keep-alive, upgrades, GOAWAY / REFUSED_STREAM,
//! retries and metrics.

mod common;

use common::{dead_port, Conf, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::{send_raw_once, wait_until_async, Client, H2Backend, TlsServer, REFUSE};

fn h2c(addr: std::net::SocketAddr) -> Weir {
    Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[addr], &["protocol = \"h2c\""])
        .start()
}

/// A WebSocket upgrade request on `client`, and its answer.
async fn websocket_upgrade(client: &mut Client) -> weir_testkit::Response {
    let fields = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    client
        .request("GET", "/ws", &fields, b"")
        .await
        .expect("response")
}

fn header<'a>(resp: &'a weir_testkit::Response, name: &str) -> &'a str {
    resp.header(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", resp.headers))
}

#[tokio::test]
async fn get_is_translated_and_the_connection_kept_alive() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    for i in 0..3 {
        let resp = client
            .get(&format!("/a/{i}?q=1"), "example.test")
            .await
            .expect("response");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.version, 1);
        assert_eq!(header(&resp, "x-method"), "GET");
        assert_eq!(header(&resp, "x-path"), format!("/a/{i}?q=1"));
        // Host became :authority (the client's, `preserve_host` being on by default).
        assert_eq!(header(&resp, "x-authority"), "example.test");
        // No content-length from the server: chunked, and no trailers unasked.
        assert_eq!(header(&resp, "transfer-encoding"), "chunked");
        assert!(resp.trailers.is_empty(), "{:?}", resp.trailers);
        assert!(resp.header("connection").is_none());
    }
    assert_eq!(backend.connections(), 1);
    assert_eq!(backend.streams(), 3);
}

#[tokio::test]
async fn connection_specific_fields_are_removed_and_te_trailers_kept() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let fields = [
        ("Connection", "x-hop, keep-alive"),
        ("X-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("X-End", "2"),
    ];
    let resp = client
        .request("GET", "/fields", &fields, b"")
        .await
        .expect("response");
    // An h2 server refuses connection-specific fields (PROTOCOL_ERROR): a 200 says they
    // were gone, and the echo lists what arrived.
    assert_eq!(resp.status, 200);
    let names = header(&resp, "x-fields");
    for gone in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
    ] {
        assert!(!names.split(',').any(|n| n == gone), "{gone} in {names}");
    }
    assert!(names.split(',').any(|n| n == "x-end"), "{names}");
    assert_eq!(header(&resp, "x-te"), "trailers");
}

#[tokio::test]
async fn trailers_reach_a_client_that_sent_te_trailers_as_chunked_trailer_fields() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let resp = client
        .request("POST", "/t", &[("TE", "trailers")], b"abc")
        .await
        .expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"abc");
    assert_eq!(resp.trailer("x-body-len"), Some("3"));
    assert_eq!(resp.trailer("grpc-status"), Some("0"));
    // Without TE: trailers the same response has none.
    let resp = client
        .request("POST", "/t", &[], b"abc")
        .await
        .expect("response");
    assert_eq!(resp.body, b"abc");
    assert!(resp.trailers.is_empty(), "{:?}", resp.trailers);
    // END_STREAM on the body's DATA, no extra empty frame.
    assert_eq!(backend.empty_data_frames(), 0);
}

/// An HTTP/1.1 client's chunked trailer section reaches an HTTP/2 upstream as trailing
/// HEADERS, whether it came with the head or after the body began to stream, less the
/// fields no trailer may carry and the names the request head does not carry as they
/// came (the forwarded headers Weir sets, the request id, the route's `request_headers`
/// names, the fields the head's `Connection` lists): an upstream that merges trailers into
/// the head would take those for Weir's.
#[tokio::test]
async fn a_clients_chunked_trailers_reach_an_h2_upstream_less_what_the_head_lost() {
    let backend = H2Backend::h2c();
    let weir = common::user_rules_to_h2c(backend.addr());
    let head = b"POST /trailer-fields HTTP/1.1\r\nHost: h\r\nTE: trailers\r\n\
                 Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let trailers = b"0\r\nX-Client-Trailer: kept\r\nX-Sum: 1\r\nX-Forwarded-For: 6.6.6.6\r\n\
                     x_real_ip: 6.6.6.6\r\nX-Request-Id: forged\r\nX-User: admin\r\n\
                     x_secret: s\r\nx-hop: 2\r\nHost: evil.test\r\nCookie: c=1\r\n\r\n";
    let mut c = weir.client().await;
    for streamed in [false, true] {
        let chunk = &b"3\r\nabc\r\n"[..];
        match streamed {
            false => c.send_raw(&[head, chunk, trailers].concat()).await,
            true => c.send_raw(&[head, chunk].concat()).await,
        }
        .expect("send");
        if streamed {
            // The stream is open (its body streaming) before the trailers are sent.
            let opened = wait_until_async(WAIT, || backend.streams() == 2).await;
            assert!(opened, "the second request's stream never opened");
            c.send_raw(trailers).await.expect("send trailers");
        }
        let resp = c.read_response(false).await.expect("response");
        assert_eq!(resp.status, 200, "streamed: {streamed}");
        assert_eq!(resp.body, b"abc");
        assert_eq!(resp.trailer("x-body-len"), Some("3"));
        let arrived = resp.trailer("x-trailer-fields");
        assert_eq!(
            arrived,
            Some("x-client-trailer,x-sum"),
            "streamed: {streamed}"
        );
        assert_eq!(resp.trailer("x-client-trailer"), Some("kept"));
    }
    assert_eq!(backend.connections(), 1);
}

/// A chunked request whose trailer section came with its head is kept whole with it: a
/// refused stream sends it again, trailers included, and a client that sent `Expect:
/// 100-continue` with all of it gets no 100 (it has nothing left to send).
#[tokio::test]
async fn a_whole_request_with_trailers_is_sent_again_after_a_refused_stream() {
    let backend = H2Backend::early_once(REFUSE);
    let weir = h2c(backend.addr());
    let mut c = weir.client().await;
    let req = b"POST /trailer-fields HTTP/1.1\r\nHost: h\r\nTE: trailers\r\n\
                Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n\
                3\r\nabc\r\n0\r\nX-Client-Trailer: again\r\n\r\n";
    c.send_raw(req).await.expect("send");
    let resp = c.read_response(false).await.expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"abc");
    assert_eq!(resp.trailer("x-client-trailer"), Some("again"));
    assert_eq!(backend.streams(), 2);
}

/// Upstream trailer fields RFC 9110 6.5.1 forbids (framing, Host, credentials, cookies,
/// content metadata) are not relayed; the others are.
#[tokio::test]
async fn forbidden_trailer_fields_are_dropped() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let resp = client
        .request("POST", "/bad-trailers", &[("TE", "trailers")], b"abc")
        .await
        .expect("response");
    assert_eq!(resp.body, b"abc");
    assert_eq!(resp.trailer("x-body-len"), Some("3"));
    for (name, _) in weir_testkit::FORBIDDEN_TRAILERS {
        assert_eq!(resp.trailer(name), None, "{name}: {:?}", resp.trailers);
    }
}

/// An HTTP/2 upstream's failure keeps the HTTP/1.1 client's connection when the request
/// was read whole, as an HTTP/1.1 upstream's does (issue 24 item 6).
#[tokio::test]
async fn a_failure_keeps_the_client_connection_when_the_request_was_read() {
    let dead = dead_port();
    let backend = H2Backend::h2c();
    let weir = Conf::new()
        .route("dead", "dead", &[r#"path_prefix = "/dead/""#])
        .route("all", "up", &[])
        .upstream("dead", &[dead.addr], &["protocol = \"h2c\""])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .start();
    let mut client = weir.client().await;
    for (method, body) in [("GET", &b""[..]), ("POST", b"abc")] {
        let r = client.request(method, "/dead/x", &[], body).await;
        let r = r.expect("answer");
        assert_eq!((r.status, r.header("connection")), (502, None), "{method}");
        let r = client
            .get("/after", "e")
            .await
            .expect("the same connection");
        assert_eq!((r.status, header(&r, "x-path")), (200, "/after"));
    }
}

/// The raw answer to a request with a body and `TE: trailers` to `path` (on a connection
/// that closes after it) through Weir to an `H2Backend`, which got it.
async fn posted_to_h2_backend(path: &str) -> String {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let ask = format!(
        "POST {path} HTTP/1.1\r\nHost: e\r\nTE: trailers\r\nContent-Length: 3\r\n\
         Connection: close\r\n\r\nabc"
    );
    let raw = send_raw_once(weir.addr, ask.as_bytes()).await;
    assert_eq!(backend.streams(), 1);
    String::from_utf8_lossy(&raw.expect("response")).into_owned()
}

/// A field name HTTP/2 carries but HTTP/1.1 does not (`x"y`: `"` is no token character)
/// in an HTTP/2 upstream's head makes the response malformed: 502, as a bad name from an
/// HTTP/1.1 upstream does, and the name never reaches the HTTP/1.1 client.
#[tokio::test]
async fn a_response_field_name_that_is_not_a_token_is_502() {
    let raw = posted_to_h2_backend("/quote-name-head").await;
    assert!(raw.starts_with("HTTP/1.1 502 "), "{raw}");
    assert!(!raw.contains("x\"y"), "{raw}");
}

/// The same name in the trailers (the head already sent): the field is dropped, as a
/// trailer field that may not be relayed is, and the others arrive.
#[tokio::test]
async fn a_trailer_field_name_that_is_not_a_token_is_dropped() {
    let raw = posted_to_h2_backend("/quote-name-trailer").await;
    assert!(raw.starts_with("HTTP/1.1 200 "), "{raw}");
    assert!(raw.contains("\r\nabc\r\n0\r\n"), "{raw}");
    assert!(raw.contains("\r\nx-body-len: 3\r\n"), "{raw}");
    assert!(!raw.contains("x\"y"), "{raw}");
}

/// A body of `len` bytes with a recognisable pattern.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn large_chunked_and_content_length_bodies_stream_under_flow_control() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    // 3 MiB: far more than the h2 server's 64 KiB window and Weir's client buffer.
    let body = pattern(3 << 20);
    let resp = client
        .request("PUT", "/len", &[("TE", "trailers")], &body)
        .await
        .expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.trailer("x-body-len"), Some("3145728"));
    assert!(resp.body == body, "echoed body differs");
    // Chunked, in uneven chunks, on the same connection.
    let mut chunked = Vec::new();
    for piece in body.chunks(70_001) {
        chunked.extend_from_slice(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\nx-request-trailer: dropped\r\n\r\n");
    let fields = [("Transfer-Encoding", "chunked"), ("TE", "trailers")];
    let resp = client
        .request("POST", "/chunked", &fields, &chunked)
        .await
        .expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.trailer("x-body-len"), Some("3145728"));
    assert!(resp.body == body, "echoed body differs");
    assert_eq!(backend.connections(), 1);
}

#[tokio::test]
async fn a_content_length_response_keeps_its_length_and_a_short_one_is_cut_off() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let resp = client.get("/fixed", "t").await.expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(header(&resp, "content-length"), "5");
    assert!(resp.header("transfer-encoding").is_none());
    assert_eq!(resp.body, b"hello");
    // DATA shorter than content-length: the h2 client refuses it, and the HTTP/1.1
    // client sees its connection closed before the promised length.
    let mut client = weir.client().await;
    let result = client.get("/badlen", "t").await;
    assert!(result.is_err(), "a short body passed as whole: {result:?}");
}

#[tokio::test]
async fn head_has_no_body_and_the_connection_goes_on() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let resp = client
        .request("HEAD", "/h", &[], b"")
        .await
        .expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(header(&resp, "content-length"), "42");
    assert!(resp.body.is_empty());
    let resp = client.get("/after-head", "t").await.expect("next response");
    assert_eq!(header(&resp, "x-path"), "/after-head");
}

#[tokio::test]
async fn interim_responses_reach_http11_clients() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    client
        .send_raw(b"GET /hints HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("send");
    let hints = client.read_response(false).await.expect("103");
    assert_eq!(hints.status, 103);
    assert_eq!(header(&hints, "link"), "</a.css>");
    let resp = client.read_response(false).await.expect("final");
    assert_eq!(resp.status, 200);
    assert_eq!(header(&resp, "x-path"), "/hints");
}

/// An HTTP/2 server's 1xx heads past the listener's `max_informational` fail the response
/// with 502 after the ones relayed; up to it, the final response comes through.
#[tokio::test]
async fn interim_responses_past_max_informational_are_502() {
    let backend = H2Backend::h2c();
    let weir = Conf::new()
        .listener("max_informational = 2")
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .start();
    for (n, last) in [(2, 200), (3, 502)] {
        let mut client = weir.client().await;
        let request = format!("GET /hints?n={n} HTTP/1.1\r\nHost: t\r\n\r\n");
        client.send_raw(request.as_bytes()).await.expect("send");
        for i in 0..2 {
            let hints = client.read_response(false).await.expect("103");
            assert_eq!(hints.status, 103, "n={n}, hint {i}");
        }
        let resp = client.read_response(false).await.expect("final");
        assert_eq!(resp.status, last, "n={n}");
    }
}

/// A `101` is malformed in HTTP/2 (RFC 9113 8.6): an HTTP/2 server's is a 502. Was: an
/// HTTP/1.1 client got `101 Switching Protocols` and then the real response on what a
/// front proxy would take for a tunnel (attacker review of the upstream side).
#[tokio::test]
async fn a_101_from_an_http2_server_is_502() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    client
        .send_raw(
            b"GET /hints-101 HTTP/1.1
Host: t

",
        )
        .await
        .expect("send");
    let resp = client.read_response(false).await.expect("final");
    assert_eq!(resp.status, 502);
}

#[tokio::test]
async fn http10_client_gets_a_body_delimited_by_close() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let raw = weir_testkit::send_raw_once(
        weir.addr,
        b"POST /old HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi",
    )
    .await
    .expect("response");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("Connection: close\r\n"), "{text}");
    assert!(!text.contains("chunked"), "{text}");
    assert!(text.ends_with("\r\n\r\nhi"), "{text}");
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let head = b"PUT /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
    client.send_raw(head).await.expect("send head");
    let go_on = client.read_response(false).await.expect("100");
    assert_eq!(go_on.status, 100);
    client.send_raw(b"body").await.expect("send body");
    let resp = client.read_response(false).await.expect("final");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"body");
}

/// An HTTP/1.0 client is sent no 1xx (RFC 9110 15.2): its `Expect` gets no 100, only the
/// final response. Was: Weir's own 100 went to it in this cell.
#[tokio::test]
async fn an_http10_client_with_expect_gets_no_100() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let head = b"PUT /e HTTP/1.0\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
    client.send_raw(head).await.expect("send head");
    // Its body once the server has the stream, as an HTTP/1.0 client that waits a moment.
    wait_until_async(WAIT, || backend.streams() == 1).await;
    client.send_raw(b"body").await.expect("send body");
    let resp = client.read_response(false).await.expect("response");
    assert_eq!(resp.status, 200, "the final response, no 100 before it");
    assert_eq!(resp.body, b"body");
}

#[tokio::test]
async fn websocket_upgrade_to_an_h2_only_upstream_is_refused_with_501() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = weir.client().await;
    let resp = websocket_upgrade(&mut client).await;
    assert_eq!(resp.status, 501);
    assert_eq!(backend.streams(), 0, "nothing reached the server");
    // Not the server's answer: no try counted for it.
    let metrics = weir.metrics_text();
    assert!(
        !metrics.contains("weir_upstream_requests_total{"),
        "{metrics}"
    );
}

/// An `h2` upstream over TLS is declared HTTP/2-only: an upgrade gets 501 and no
/// connection is made, even to a server that would speak HTTP/1.1 (here an HTTP/1.1
/// echo): trying HTTP/1.1 on an h2-only server would count its refusal as the server's
/// failure, and anyone could eject the pool's servers that way.
#[tokio::test]
async fn websocket_upgrade_to_a_tls_h2_upstream_is_501_and_reaches_no_server() {
    let ca = TestCa::new("ws upstream CA");
    let leaf = ca.leaf(&["127.0.0.1"]);
    let backend = weir_testkit::Backend::echo_tls("h1", &TlsServer::new(&leaf));
    let tls = format!("tls = {{ ca = \"{}\" }}", ca.cert_path.display());
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2\"", &tls])
        .start();
    let mut client = weir.client().await;
    let resp = websocket_upgrade(&mut client).await;
    assert_eq!(resp.status, 501);
    assert_eq!(
        backend.connections_accepted(),
        0,
        "nothing reached the server"
    );
}

/// Weir answers `Expect: 100-continue` itself once a server took the stream: a request no
/// server takes gets its error alone.
#[tokio::test]
async fn expect_100_continue_to_a_dead_server_gets_no_100() {
    let dead = dead_port();
    let weir = h2c(dead.addr);
    let mut client = weir.client().await;
    let head = b"PUT /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
    client.send_raw(head).await.expect("send head");
    let resp = client.read_response(false).await.expect("response");
    assert_eq!(resp.status, 502);
}

#[tokio::test]
async fn refused_streams_after_goaway_are_sent_again_with_their_body() {
    // Each connection serves one stream, then says GOAWAY and refuses any other.
    let backend = H2Backend::goaway_after(1);
    let weir = h2c(backend.addr());
    // A request that stays open keeps the first connection (and its GOAWAY) alive.
    let mut hanging = weir.client().await;
    hanging
        .send_raw(b"GET /hang HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("send");
    assert!(
        wait_until_async(WAIT, || backend.streams() == 1).await,
        "the hanging request reached the backend"
    );
    let mut client = weir.client().await;
    for i in 0..4 {
        let resp = client
            .request(
                "POST",
                &format!("/after/{i}"),
                &[("TE", "trailers")],
                b"again",
            )
            .await
            .expect("response");
        assert_eq!(resp.status, 200, "request {i}");
        assert_eq!(resp.body, b"again");
        assert_ne!(
            header(&resp, "x-conn"),
            "1",
            "not on the connection going away"
        );
    }
    assert_eq!(backend.streams(), 5, "each request processed once");
}

/// A `PUT` of 4 bytes whose body comes late: the head alone (reading Weir's own 100
/// Continue when `expect`), then the body once `backends` have accepted `streams` streams
/// (the try that is answered has begun), or after [`WAIT`] when they never do.
async fn late_body_put(
    weir: &Weir,
    expect: bool,
    backends: &[&H2Backend],
    streams: usize,
) -> weir_testkit::Response {
    let mut client = weir.client().await;
    let expect_field = if expect {
        "Expect: 100-continue\r\n"
    } else {
        ""
    };
    let head = format!("PUT /late HTTP/1.1\r\nHost: t\r\n{expect_field}Content-Length: 4\r\n\r\n");
    client.send_raw(head.as_bytes()).await.expect("send head");
    if expect {
        let go_on = client.read_response(false).await.expect("100");
        assert_eq!(go_on.status, 100);
    }
    let accepted = || backends.iter().map(|b| b.streams()).sum::<usize>();
    wait_until_async(WAIT, || accepted() >= streams).await;
    client.send_raw(b"body").await.expect("send body");
    client.read_response(false).await.expect("final response")
}

/// Regression: a streamed upload's first try took the head out of the client buffer; a
/// refused stream then rebuilt the request from the emptied buffer and panicked (the
/// whole process aborts). Refused before any body byte, it goes again with its body.
#[tokio::test]
async fn a_refused_stream_of_an_upload_whose_body_is_late_is_sent_again() {
    for expect in [false, true] {
        let backend = H2Backend::early_once(REFUSE);
        let weir = h2c(backend.addr());
        let resp = late_body_put(&weir, expect, &[&backend], 2).await;
        assert_eq!(resp.status, 200, "expect {expect}");
        assert_eq!(resp.body, b"body", "expect {expect}");
        assert_eq!(backend.streams(), 2, "expect {expect}");
    }
}

/// As above, for a listed status answered before any body byte: the request goes to the
/// other server with its body. After Weir's own 100 Continue the client has a response
/// byte: the 503 is relayed.
#[tokio::test]
async fn a_retried_status_before_a_late_body_sends_the_upload_to_another_server() {
    for expect in [false, true] {
        let busy = H2Backend::early_once(503);
        let echo = H2Backend::h2c();
        let weir = Conf::new()
            .route("all", "up", &[])
            .upstream(
                "up",
                &[busy.addr(), echo.addr()],
                &["protocol = \"h2c\"", "retry = { on = [\"503\"] }"],
            )
            .start();
        // Round robin: to the busy server first.
        let streams = if expect { 1 } else { 2 };
        let resp = late_body_put(&weir, expect, &[&busy, &echo], streams).await;
        assert_eq!(busy.streams(), 1, "expect {expect}");
        if expect {
            assert_eq!(resp.status, 503);
            assert_eq!(echo.streams(), 0, "not retried after a 100 Continue");
        } else {
            assert_eq!(resp.status, 200);
            assert_eq!(resp.body, b"body");
            assert_eq!(echo.streams(), 1);
        }
    }
}

#[tokio::test]
async fn a_dead_server_is_retried_on_another_and_counted() {
    let backend = H2Backend::h2c();
    let dead = dead_port();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream(
            "up",
            &[dead.addr, backend.addr()],
            &["protocol = \"h2c\"", "lb = \"round_robin\""],
        )
        .start();
    let mut client = weir.client().await;
    for i in 0..4 {
        let resp = client.get(&format!("/r/{i}"), "t").await.expect("response");
        assert_eq!(resp.status, 200, "request {i}");
    }
    // Counted once the response is written: poll.
    let served = "weir_upstream_requests_total{upstream=\"up\",server=\"{B}\",code=\"200\"} 4"
        .replace("{B}", &backend.addr().to_string());
    let counted = wait_until_async(WAIT, || weir.metrics_text().contains(&served)).await;
    let metrics = weir.metrics_text();
    assert!(counted, "{served} not in {metrics}");
    assert!(
        metrics.contains("weir_upstream_retries_total{upstream=\"up\"} "),
        "{metrics}"
    );
    assert!(!metrics.contains("weir_upstream_retries_total{upstream=\"up\"} 0"));
}

#[tokio::test]
async fn h2_over_tls_upstream_serves_http11_clients() {
    let ca = TestCa::new("upstream CA");
    let backend = H2Backend::tls(&TlsServer::h2(&ca.leaf(&["127.0.0.1"])));
    let tls = format!("tls = {{ ca = \"{}\" }}", ca.cert_path.display());
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2\"", &tls])
        .start();
    let mut client: Client = weir.client().await;
    let resp = client.get("/secure", "t").await.expect("response");
    assert_eq!(resp.status, 200);
    assert_eq!(header(&resp, "x-path"), "/secure");
}
