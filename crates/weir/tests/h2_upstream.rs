//! HTTP/2 to upstreams (`protocol = "h2c"` / `"h2"`): h2c clients through Weir to an
//! HTTP/2 echo backend (weir-testkit's `H2Backend`) over real sockets: multiplexing on one
//! upstream connection, bodies and trailers both ways, gRPC-shaped requests and the gRPC
//! status Weir answers with when it fails one, GOAWAY from the upstream, and h2 over TLS.

mod common;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::RecvStream;
use http::{HeaderMap, Method, Request, Response, StatusCode};

use common::{dead_port, Conf, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::{pattern_vec, wait_until_async, Backend, H2Backend, TlsServer};

async fn connect(weir: &Weir) -> SendRequest<Bytes> {
    common::h2c_client(weir.addr).await
}

/// Weir proxying everything to `addr` with the upstream keys `keys`.
fn proxy(addr: std::net::SocketAddr, keys: &[&str]) -> Weir {
    Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[addr], keys)
        .start()
}

fn h2c(addr: std::net::SocketAddr) -> Weir {
    proxy(addr, &["protocol = \"h2c\""])
}

fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://example.test{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("request")
}

/// A whole response: head, body, trailers.
struct Full {
    head: Response<()>,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Full {
    fn header(&self, name: &str) -> &str {
        self.head
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.head.headers()))
    }

    fn trailer(&self, name: &str) -> &str {
        let trailers = self.trailers.as_ref().expect("trailers");
        trailers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no trailer {name} in {trailers:?}"))
    }
}

async fn read(response: h2::client::ResponseFuture) -> Full {
    let response = response.await.expect("response");
    let (parts, mut body) = response.into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    let trailers = body_trailers(&mut body).await;
    Full {
        head: Response::from_parts(parts, ()),
        body: out,
        trailers,
    }
}

async fn body_trailers(body: &mut RecvStream) -> Option<HeaderMap> {
    body.trailers().await.expect("trailers")
}

/// Sends `request` with `body` (and `trailers`, if any) and reads the whole response.
async fn exchange(
    client: &SendRequest<Bytes>,
    request: Request<()>,
    body: &[u8],
    trailers: Option<HeaderMap>,
) -> Full {
    let mut client = client.clone().ready().await.expect("ready");
    let end = body.is_empty() && trailers.is_none();
    let (response, mut send) = client.send_request(request, end).expect("send request");
    if !end {
        send.send_data(Bytes::copy_from_slice(body), trailers.is_none())
            .expect("send body");
        if let Some(t) = trailers {
            send.send_trailers(t).expect("send trailers");
        }
    }
    read(response).await
}

async fn get(client: &SendRequest<Bytes>, path: &str) -> Full {
    exchange(client, request(Method::GET, path, &[]), b"", None).await
}

/// An h2 client's request is made into the upstream's from its own fields, not from an
/// HTTP/1.1 head: the upstream must get what an HTTP/1.1 client's request gives it, field
/// for field (hop-by-hop and Weir's own fields dropped, the request id and forwarded
/// headers added, the path rewritten, `te: trailers` kept), on routes with and without
/// edits.
#[tokio::test]
async fn an_h2_clients_fields_reach_the_upstream_as_an_http1_clients_do() {
    let backend = H2Backend::h2c();
    let rules = "request_headers = { set = { \"Host\" = \"in.{host}\", \"X-Env\" = \"prod\" }, \
                 add = { \"X-Via\" = \"weir {request_id}\" }, remove = [\"X-Debug\"] }";
    let routes: [&[&str]; 3] = [
        &[],
        &[
            "rewrite_prefix = \"/show-fields/in/\"",
            "preserve_host = false",
        ],
        &["forwarded_headers = false", rules],
    ];
    let fields = [
        ("x-forwarded-for", "1.1.1.1"),
        ("x-real-ip", "6.6.6.6"),
        ("x-forwarded-host", "spoofed.test"),
        ("trailer", "x-t"),
        ("x-request-id", "client-id"),
        ("x-debug", "1"),
        ("x-env", "test"),
        ("cookie", "a=1"),
        ("cookie", "b=2"),
        ("te", "trailers"),
        ("x-end", " padded "),
    ];
    // The request id is new on every request: both clients send the same one, which Weir
    // trusts (`trust_client`) and sends on in a field of its own.
    let id = ("x-request-id", "same-id");
    for keys in routes {
        let weir = Conf::new()
            .with_request_ids()
            .route("all", "up", keys)
            .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
            .start();
        let client = connect(&weir).await;
        let mut sent: Vec<(&str, &str)> = fields.iter().copied().filter(|f| f.0 != id.0).collect();
        sent.push(id);
        let h2 = exchange(
            &client,
            request(Method::GET, "/show-fields/a?q=1", &sent),
            b"",
            None,
        );
        let h2 = h2.await;
        sent.push(("host", "example.test"));
        let mut h1 = weir.client().await;
        let h1 = h1.request("GET", "/show-fields/a?q=1", &sent, b"").await;
        let h1 = h1.expect("HTTP/1.1 response");
        assert_eq!(
            (h2.head.status(), h1.status),
            (StatusCode::OK, 200),
            "{keys:?}"
        );
        let shown = String::from_utf8_lossy(&h2.body);
        assert_eq!(shown, String::from_utf8_lossy(&h1.body), "{keys:?}");
        for name in ["x-path", "x-authority", "x-method", "x-te"] {
            let h1_value = h1.header(name).unwrap_or_default();
            assert_eq!(h2.header(name), h1_value, "{name} on {keys:?}");
        }
        assert!(shown.contains("x-request-id: same-id\n"), "{shown}");
        assert!(!shown.contains("trailer:"), "{shown}");
        let via = shown.contains("x-via: weir same-id\n");
        assert_eq!(via, keys.contains(&rules), "{shown}");
        assert_eq!(shown.contains("x-debug"), !keys.contains(&rules), "{shown}");
        // The client's forwarded headers are replaced where the route sets them.
        let forwarded = !keys.contains(&"forwarded_headers = false");
        assert_eq!(shown.contains("spoofed"), !forwarded, "{shown}");
    }
}

#[tokio::test]
async fn multiplexed_requests_share_one_upstream_connection() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let full = get(&client, &format!("/item/{i}?q={i}")).await;
            (i, full)
        }));
    }
    for task in tasks {
        let (i, full) = task.await.expect("task");
        assert_eq!(full.head.status(), StatusCode::OK);
        assert_eq!(full.header("x-path"), format!("/item/{i}?q={i}"));
        assert_eq!(full.header("x-authority"), "example.test");
        assert_eq!(full.trailer("grpc-status"), "0");
    }
    assert_eq!(backend.streams(), 24);
    assert_eq!(
        backend.connections(),
        1,
        "one multiplexed upstream connection"
    );
}

/// h2 on both sides, Content-Length checked against DATA: a response whose DATA matches
/// its length passes with it; one whose DATA falls short of it never reaches the client
/// as a whole body (the stream is reset), and the connection serves the next request.
#[tokio::test]
async fn an_h2_response_shorter_than_its_content_length_is_reset_not_passed_whole() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let fixed = get(&client, "/fixed").await;
    assert_eq!(fixed.header("content-length"), "5");
    assert_eq!(fixed.body, b"hello");
    let mut ready = client.clone().ready().await.expect("ready");
    let (response, _) = ready
        .send_request(request(Method::GET, "/badlen", &[]), true)
        .expect("send");
    let outcome = async {
        let mut body = response.await?.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk?);
        }
        Ok::<_, h2::Error>(got)
    };
    let outcome = tokio::time::timeout(WAIT, outcome).await.expect("in time");
    assert!(
        outcome.is_err(),
        "a short body passed as whole: {outcome:?}"
    );
    assert_eq!(get(&client, "/fixed").await.body, b"hello");
}

/// `max_concurrent_streams` bounds the streams in flight on one upstream connection: five
/// requests the server holds open, with a bound of 2, take three connections (one, with
/// the default bound of 100: `multiplexed_requests_share_one_upstream_connection`).
#[tokio::test]
async fn max_concurrent_streams_opens_another_connection_when_one_is_full() {
    let backend = H2Backend::h2c();
    let weir = proxy(
        backend.addr(),
        &["protocol = \"h2c\"", "max_concurrent_streams = 2"],
    );
    let client = connect(&weir).await;
    let mut held = Vec::new();
    for i in 0..5 {
        let mut ready = client.clone().ready().await.expect("ready");
        let path = format!("/hang/{i}");
        held.push(ready.send_request(request(Method::GET, &path, &[]), true));
    }
    assert!(
        wait_until_async(WAIT, || backend.streams() == 5).await,
        "every request reached the server: {}",
        backend.streams()
    );
    assert_eq!(backend.connections(), 3, "2 + 2 + 1 streams");
}

#[tokio::test]
async fn idle_timeout_closes_idle_upstream_connections() {
    let backend = H2Backend::h2c();
    // idle_timeout = 0: a connection with no stream in flight is not reused.
    let weir = proxy(
        backend.addr(),
        &["protocol = \"h2c\"", "idle_timeout = \"0s\""],
    );
    let client = connect(&weir).await;
    for i in 0..3 {
        assert_eq!(
            get(&client, &format!("/{i}")).await.head.status(),
            StatusCode::OK
        );
    }
    assert_eq!(backend.connections(), 3);
    // And with the default, one connection serves them all.
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    for i in 0..3 {
        assert_eq!(
            get(&client, &format!("/{i}")).await.head.status(),
            StatusCode::OK
        );
    }
    assert_eq!(backend.connections(), 1);
}

#[tokio::test]
async fn request_and_response_bodies_and_trailers_go_both_ways() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    // Larger than the default 64 KiB windows: flow control on both legs.
    let body = pattern_vec(300_000);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-client-trailer", "from-client".parse().expect("value"));
    let req = request(Method::POST, "/upload", &[("te", "trailers")]);
    let full = exchange(&client, req, &body, Some(trailers)).await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("x-method"), "POST");
    assert_eq!(full.header("x-te"), "trailers", "te: trailers kept");
    assert!(
        full.body == body,
        "body echoed intact ({} bytes)",
        full.body.len()
    );
    assert_eq!(full.trailer("x-body-len"), "300000");
    assert_eq!(full.trailer("x-client-trailer"), "from-client");
}

/// An HTTP/2 client's trailer fields reach an HTTP/2 upstream less the names its request
/// head does not carry as they came (the forwarded headers Weir sets, in the CGI spelling
/// too, the request id, the names the route's `request_headers` sets or removes) and
/// those no trailer may carry: an upstream that merges trailers into the head would take
/// them for Weir's. The others go.
#[tokio::test]
async fn request_trailers_lose_the_names_the_head_does_not_carry() {
    let backend = H2Backend::h2c();
    let weir = common::user_rules_to_h2c(backend.addr());
    let client = connect(&weir).await;
    let mut trailers = HeaderMap::new();
    for (name, value) in [
        ("x-client-trailer", "kept"),
        ("x-sum", "1"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("x_forwarded_for", "6.6.6.6"),
        ("x-forwarded-proto", "https"),
        ("x-request-id", "forged"),
        ("x-user", "admin"),
        ("x_secret", "s"),
        ("authorization", "Basic eDp5"),
    ] {
        trailers.insert(name, value.parse().expect("value"));
    }
    let req = request(Method::POST, "/trailer-fields", &[]);
    let full = exchange(&client, req, b"body", Some(trailers)).await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.body, b"body");
    assert_eq!(full.trailer("x-trailer-fields"), "x-client-trailer,x-sum");
    assert_eq!(full.trailer("x-client-trailer"), "kept");
}

/// A gRPC message: compression flag, big-endian length, payload.
fn grpc_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn grpc_request(path: &str, extra: &[(&str, &str)]) -> Request<()> {
    let mut headers = vec![("content-type", "application/grpc"), ("te", "trailers")];
    headers.extend_from_slice(extra);
    request(Method::POST, path, &headers)
}

#[tokio::test]
async fn grpc_unary_request_relays_message_and_status_trailer() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let message = grpc_frame(b"\x0a\x05hello");
    let full = exchange(&client, grpc_request("/echo.Echo/Say", &[]), &message, None).await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("content-type"), "application/grpc");
    assert_eq!(full.body, message);
    assert_eq!(full.trailer("grpc-status"), "0");
    // END_STREAM rode on the message's DATA, as the client sent it: no extra empty frame
    // per call (which the h2 crate also counts as a flood past 100 per connection).
    assert_eq!(backend.empty_data_frames(), 0);
}

/// An h2c upstream's 103 (the testkit's `/hints`) reaches the h2 client before the final
/// response, with its Link.
#[tokio::test]
async fn early_hints_from_an_h2c_upstream_reach_the_h2_client() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = connect(&weir).await.ready().await.expect("ready");
    let (response, _) = client
        .send_request(request(Method::GET, "/hints", &[]), true)
        .expect("send request");
    let answer = common::read_with_interims(response).await;
    assert_eq!(answer.interims.len(), 1, "{:?}", answer.interims);
    assert_eq!(answer.interims[0].status(), StatusCode::EARLY_HINTS);
    assert_eq!(answer.interims[0].headers()["link"], "</a.css>");
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.head.headers()["x-path"], "/hints");
}

/// An h2c upstream that sends a 103 and then no final head within the response timeout:
/// the client has part of the response, so the request is not tried on the other server;
/// the client gets the 103, then 504.
#[tokio::test]
async fn a_timeout_after_relayed_hints_is_not_retried() {
    let (a, b) = (H2Backend::h2c(), H2Backend::h2c());
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream(
            "up",
            &[a.addr(), b.addr()],
            &[
                "protocol = \"h2c\"\nresponse_timeout = \"200ms\"",
                "[upstreams.up.passive]\nmax_fails = 0",
                "[upstreams.up.retry]\nattempts = 1\non = [\"timeout\"]",
            ],
        )
        .start();
    let mut client = connect(&weir).await.ready().await.expect("ready");
    let (response, _) = client
        .send_request(request(Method::GET, "/hints-hang", &[]), true)
        .expect("send request");
    let answer = common::read_with_interims(response).await;
    assert_eq!(answer.interims.len(), 1, "{:?}", answer.interims);
    assert_eq!(answer.head.status(), StatusCode::GATEWAY_TIMEOUT);
    // A stream is counted when accepted: final once the client has its answer.
    assert_eq!(a.streams() + b.streams(), 1, "retried");
}

/// An upstream head larger than the upstream's `max_header_list_size` (its `x-path` echoes a
/// 2 KiB path) is not taken: 502; a smaller one still passes.
#[tokio::test]
async fn an_upstream_head_past_max_header_list_size_is_502() {
    let backend = H2Backend::h2c();
    let weir = proxy(
        backend.addr(),
        &["protocol = \"h2c\"\nmax_header_list_size = \"1KiB\""],
    );
    let client = connect(&weir).await;
    let long = format!("/{}", "a".repeat(2048));
    assert_eq!(
        get(&client, &long).await.head.status(),
        StatusCode::BAD_GATEWAY
    );
    let short = get(&client, "/short").await;
    assert_eq!(short.head.status(), StatusCode::OK);
    assert_eq!(short.head.headers()["x-path"], "/short");
}

/// From an h2c upstream too, at most `max_informational` 1xx heads per response reach the
/// client, and the upstream's 100 is dropped when Weir sent its own for
/// `expect: 100-continue`.
#[tokio::test]
async fn an_h2c_upstreams_hints_are_capped_and_its_100_dropped() {
    let backend = H2Backend::h2c();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .listener("http2 = { max_informational = 2 }")
        .start();
    let mut client = connect(&weir).await.ready().await.expect("ready");
    let headers = [("expect", "100-continue"), ("content-length", "2")];
    let req = request(Method::POST, "/hints-100?n=5", &headers);
    let (mut response, mut send) = client.send_request(req, false).expect("send request");
    let interim = common::first_interim(&mut response).await;
    assert_eq!(interim.status(), StatusCode::CONTINUE);
    send.send_data(Bytes::from_static(b"hi"), true)
        .expect("body");
    let answer = common::read_with_interims(response).await;
    let hints: Vec<_> = answer
        .interims
        .iter()
        .map(|h| (h.status(), h.headers()["x-hint"].clone()))
        .collect();
    let hint = |i: &'static str| (StatusCode::EARLY_HINTS, http::HeaderValue::from_static(i));
    assert_eq!(hints, [hint("0"), hint("1")]);
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.body, b"hi");
}

/// An h2c upstream looping on 1xx cannot hold an h2 client's stream until
/// `response_timeout`: past the larger of the listener's `max_informational` and
/// `http2.max_informational` (here 3), the client gets 502 after the relayed ones, counted
/// as the server's 502; up to the bound, the final head comes.
#[tokio::test]
async fn an_h2c_upstream_looping_on_1xx_gets_the_h2_client_a_502() {
    let backend = H2Backend::h2c();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .listener("max_informational = 3\nhttp2 = { max_informational = 2 }")
        .start();
    let mut client = connect(&weir).await.ready().await.expect("ready");
    let (status, interims) = get_interims(&mut client, "/hints?n=4").await;
    assert_eq!((status, interims), (StatusCode::BAD_GATEWAY, 2));
    let (status, interims) = get_interims(&mut client, "/hints?n=3").await;
    assert_eq!((status, interims), (StatusCode::OK, 2));
    let upstream_502 = format!(
        "weir_upstream_requests_total{{upstream=\"up\",server=\"{}\",code=\"502\"}}",
        backend.addr()
    );
    weir.wait_metric(&upstream_502, 1).await;
}

/// A GET of `path`: the final status and how many 1xx heads came before it.
async fn get_interims(client: &mut SendRequest<Bytes>, path: &str) -> (StatusCode, usize) {
    let req = request(Method::GET, path, &[]);
    let (response, _) = client.send_request(req, true).expect("send request");
    let answer = common::read_with_interims(response).await;
    (answer.head.status(), answer.interims.len())
}

/// The access log's `grpc_status` is what the client got: from the upstream's trailers (0
/// and 7), from its trailers-only head (5), from Weir's own answer (no route: 12), and
/// null for a request that is not gRPC.
#[tokio::test]
async fn access_log_has_the_grpc_status_the_client_got() {
    let backend = H2Backend::h2c();
    let log = common::JsonLog::new("grpc-status");
    let weir = Conf::new()
        .listener(&log.listener_line())
        .route("echo", "up", &["path_prefix = \"/echo.\""])
        .route("health", "up", &["path_prefix = \"/grpc.health.v1.\""])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .start();
    let client = connect(&weir).await;
    // (path, extra request fields, message payload, the grpc-status the client gets)
    type Call<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [u8], &'a str);
    let calls: [Call; 4] = [
        ("/echo.Echo/Say", &[], b"\x0a\x02hi", "0"),
        ("/echo.Echo/Deny", &[("x-grpc-status", "7")], b"", "7"),
        ("/grpc.health.v1.Health/Check", &[], b"\x0a\x03zzz", "5"),
        ("/nowhere.Svc/Call", &[], b"", "12"),
    ];
    for (path, extra, payload, code) in calls {
        let full = exchange(
            &client,
            grpc_request(path, extra),
            &grpc_frame(payload),
            None,
        )
        .await;
        let sent = match &full.trailers {
            Some(_) => full.trailer("grpc-status"),
            None => full.header("grpc-status"),
        };
        assert_eq!(sent, code, "{path}");
    }
    let full = get(&client, "/echo.plain").await;
    assert_eq!(full.head.status(), StatusCode::OK);
    let lines = log.lines(5);
    let line = |target: &str| {
        let field = format!("\"target\":\"{target}\"");
        lines
            .iter()
            .find(|l| l.contains(&field))
            .unwrap_or_else(|| panic!("no line for {target}: {lines:?}"))
            .clone()
    };
    for (path, _, _, code) in calls {
        let want = format!("\"grpc_status\":{code},");
        assert!(line(path).contains(&want), "{want} in {}", line(path));
    }
    assert!(line("/echo.plain").contains("\"grpc_status\":null,"));
}

#[tokio::test]
async fn grpc_bidirectional_stream_echoes_each_message_before_the_next_is_sent() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let mut client = connect(&weir).await.ready().await.expect("ready");
    let (response, mut send) = client
        .send_request(grpc_request("/echo.Echo/Chat", &[]), false)
        .expect("send");
    let response = response
        .await
        .expect("response head before the request ends");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    for i in 0..3u8 {
        let message = grpc_frame(&[i; 10]);
        send.send_data(Bytes::from(message.clone()), false)
            .expect("send message");
        // The echo must come back while the request stream is still open.
        let mut got = Vec::new();
        while got.len() < message.len() {
            let chunk = body.data().await.expect("more data").expect("data");
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, message, "message {i}");
    }
    send.send_data(Bytes::new(), true).expect("end");
    assert!(body.data().await.is_none());
    let trailers = body.trailers().await.expect("trailers").expect("some");
    assert_eq!(trailers["grpc-status"], "0");
}

#[tokio::test]
async fn grpc_request_to_a_down_upstream_gets_unavailable_not_502() {
    let dead = dead_port();
    let weir = h2c(dead.addr);
    let client = connect(&weir).await;
    let full = exchange(
        &client,
        grpc_request("/echo.Echo/Say", &[]),
        &grpc_frame(b"x"),
        None,
    )
    .await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("grpc-status"), "14", "UNAVAILABLE");
    assert!(full.header("grpc-message").contains("connect"));
    assert!(
        full.body.is_empty() && full.trailers.is_none(),
        "trailers-only"
    );
    // Counted as the 502 Weir meant, not the 200 on the wire (once the answer was sent).
    let series = "weir_requests_total{listener=\"web\",route=\"all\",method=\"POST\",code=\"502\",protocol=\"HTTP/2.0\"}";
    weir.wait_metric(series, 1).await;
    // Not gRPC: the plain HTTP answer.
    assert_eq!(
        get(&client, "/").await.head.status(),
        StatusCode::BAD_GATEWAY
    );
}

#[tokio::test]
async fn grpc_request_reset_by_the_upstream_gets_unavailable() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let full = exchange(
        &client,
        grpc_request("/reset", &[]),
        &grpc_frame(b"x"),
        None,
    )
    .await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("grpc-status"), "14", "UNAVAILABLE");
    assert_eq!(
        get(&client, "/reset").await.head.status(),
        StatusCode::BAD_GATEWAY
    );
    // The connection survives a stream reset: everything went over one.
    assert_eq!(get(&client, "/ok").await.head.status(), StatusCode::OK);
    assert_eq!(backend.connections(), 1);
}

#[tokio::test]
async fn grpc_timeout_caps_the_response_timeout() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let req = grpc_request("/hang", &[("grpc-timeout", "150m")]);
    let full = exchange(&client, req, &grpc_frame(b"x"), None).await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("grpc-status"), "4", "DEADLINE_EXCEEDED");
}

/// The deadline runs while the client still sends: a client-streaming call to a silent
/// upstream ends with DEADLINE_EXCEEDED, not when the client stops sending.
#[tokio::test]
async fn grpc_timeout_runs_while_the_client_is_still_sending() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let mut client = client.ready().await.expect("ready");
    let req = grpc_request("/hang", &[("grpc-timeout", "150m")]);
    let (response, mut send) = client.send_request(req, false).expect("send request");
    send.send_data(Bytes::from(grpc_frame(b"x")), false)
        .expect("send a message");
    // The stream stays open (`send` lives on): only the deadline can end the wait.
    let full = tokio::time::timeout(WAIT, read(response)).await;
    let full = full.expect("answered before the client ended its stream");
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(full.header("grpc-status"), "4", "DEADLINE_EXCEEDED");
    drop(send);
}

#[tokio::test]
async fn goaway_from_the_upstream_moves_later_requests_to_a_new_connection() {
    let backend = H2Backend::goaway_after(3);
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    for i in 0..10 {
        let full = get(&client, &format!("/seq/{i}")).await;
        assert_eq!(full.head.status(), StatusCode::OK, "request {i}");
        assert_eq!(full.header("x-path"), format!("/seq/{i}"));
    }
    // Concurrent ones too: none fails while connections go away under them (fewer than
    // Weir's 5 tries need, when every connection takes 3 streams).
    let mut tasks = Vec::new();
    for i in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            get(&client, &format!("/par/{i}")).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.expect("task").head.status(), StatusCode::OK);
    }
    assert!(
        backend.connections() >= 4,
        "a new connection after each GOAWAY, got {}",
        backend.connections()
    );
}

#[tokio::test]
async fn streams_refused_after_goaway_are_sent_again_on_a_new_connection() {
    // Each connection serves one stream, then says GOAWAY and refuses any other.
    let backend = H2Backend::goaway_after(1);
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    // A stream that stays open keeps the first connection (and its GOAWAY) alive.
    let hanging = client.clone();
    let _hang = tokio::spawn(async move { get(&hanging, "/hang").await });
    assert!(
        wait_until_async(WAIT, || backend.streams() == 1).await,
        "the hanging stream reached the backend"
    );
    for i in 0..5 {
        let full = get(&client, &format!("/after/{i}")).await;
        assert_eq!(full.head.status(), StatusCode::OK, "request {i}");
        assert_eq!(full.header("x-path"), format!("/after/{i}"));
        assert_ne!(
            full.header("x-conn"),
            "1",
            "not on the connection going away"
        );
    }
    assert_eq!(backend.streams(), 6, "each request processed once");
}

#[tokio::test]
async fn a_client_reset_cancels_the_upstream_stream() {
    let backend = H2Backend::h2c();
    let weir = h2c(backend.addr());
    let client = connect(&weir).await;
    let mut ready = client.clone().ready().await.expect("ready");
    let (response, mut send) = ready
        .send_request(request(Method::GET, "/hang", &[]), true)
        .expect("send");
    assert!(
        wait_until_async(WAIT, || backend.streams() == 1).await,
        "the request reached the backend"
    );
    send.send_reset(h2::Reason::CANCEL);
    drop(response);
    assert!(
        wait_until_async(WAIT, || backend.resets() == 1).await,
        "the upstream stream was reset too"
    );
    // The upstream connection stays for the next request.
    assert_eq!(get(&client, "/next").await.head.status(), StatusCode::OK);
    assert_eq!(backend.connections(), 1);
}

#[tokio::test]
async fn h2_over_tls_upstream_with_alpn() {
    let ca = TestCa::new("upstream CA");
    let backend = H2Backend::tls(&TlsServer::h2(&ca.leaf(&["127.0.0.1"])));
    let tls = format!("tls = {{ ca = \"{}\" }}", ca.cert_path.display());
    let weir = proxy(backend.addr(), &["protocol = \"h2\"", &tls]);
    let client = connect(&weir).await;
    for i in 0..3 {
        let full = get(&client, &format!("/tls/{i}")).await;
        assert_eq!(full.head.status(), StatusCode::OK);
        assert_eq!(full.header("x-path"), format!("/tls/{i}"));
        assert_eq!(full.trailer("grpc-status"), "0");
    }
    assert_eq!(backend.connections(), 1);
}

#[tokio::test]
async fn auto_speaks_h2_when_the_server_chooses_it_and_http1_otherwise() {
    let ca = TestCa::new("upstream CA");
    let leaf = ca.leaf(&["127.0.0.1"]);
    let tls = format!("tls = {{ ca = \"{}\" }}", ca.cert_path.display());
    let keys = ["protocol = \"auto\"", tls.as_str()];
    // ALPN: the server offers only h2.
    let h2_backend = H2Backend::tls(&TlsServer::h2(&leaf));
    let weir = proxy(h2_backend.addr(), &keys);
    let full = get(&connect(&weir).await, "/auto").await;
    assert_eq!(full.head.status(), StatusCode::OK);
    assert_eq!(
        full.header("x-path"),
        "/auto",
        "answered by the HTTP/2 backend"
    );
    assert_eq!(h2_backend.streams(), 1);
    // ALPN: the server offers only http/1.1: the same request goes over HTTP/1.1.
    let h1_backend = Backend::echo_tls("h1", &TlsServer::new(&leaf));
    let weir = proxy(h1_backend.addr(), &keys);
    let client = connect(&weir).await;
    for _ in 0..2 {
        let full = get(&client, "/auto").await;
        assert_eq!(full.head.status(), StatusCode::OK);
        assert_eq!(full.header("x-backend"), "h1");
    }
    assert_eq!(h1_backend.requests_served(), 2);
}

/// The upstream's response head reached the client while the client's body was still
/// coming; the body then outgrows `max_body_size`: the response is cut short and counted
/// with the 200 the client got, as aborted, not as a 413 Weir never sent.
#[tokio::test]
async fn a_body_over_the_limit_after_the_response_began_is_an_aborted_200() {
    let backend = H2Backend::h2c();
    let weir = Conf::new()
        .listener("max_body_size = \"16\"")
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .start();
    let client = connect(&weir).await;
    let mut client = client.ready().await.expect("ready");
    let (response, mut up) = client
        .send_request(request(Method::POST, "/upload", &[]), false)
        .expect("request");
    // The echo answers at once, before any body byte.
    let head = tokio::time::timeout(WAIT, response)
        .await
        .expect("head in time")
        .expect("head");
    assert_eq!(head.status(), StatusCode::OK);
    up.send_data(Bytes::from(vec![b'x'; 64]), false)
        .expect("data");
    let mut body = head.into_body();
    loop {
        match tokio::time::timeout(WAIT, body.data()).await {
            Ok(Some(Ok(_))) => {}
            Ok(None | Some(Err(_))) => break,
            Err(_) => panic!("the response was not cut short"),
        }
    }
    let aborted = || {
        weir.metrics_text()
            .contains("weir_responses_aborted_total{")
    };
    assert!(wait_until_async(WAIT, aborted).await, "counted as aborted");
    let text = weir.metrics_text();
    let code = |c: &str| {
        text.lines()
            .any(|l| l.starts_with("weir_requests_total{") && l.contains(&format!("code=\"{c}\"")))
    };
    assert!(code("200") && !code("413"), "{text}");
}
