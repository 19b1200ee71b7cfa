//! HTTP/2 with prior knowledge (h2c) on a cleartext listener, proxied to HTTP/1.1
//! upstreams: multiplexing, bodies both ways under flow control, local answers, and the
//! rapid-reset defence. The client is the `h2` crate's, over real sockets.

mod common;

use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{Reason, RecvStream};
use http::{Method, Request, StatusCode};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use common::{dead_port, single, Conf, WAIT};
use weir_testkit::{pattern_hash, pattern_vec, sink_summary, wait_until_async, Backend, Hasher};

/// An h2c connection to `addr`: the request handle and the task driving the connection
/// (its result says how the connection ended).
async fn connect(
    addr: std::net::SocketAddr,
) -> (SendRequest<Bytes>, JoinHandle<Result<(), h2::Error>>) {
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    (client, tokio::spawn(conn))
}

fn request(method: Method, path: &str) -> Request<()> {
    Request::builder()
        .method(method)
        .uri(format!("http://example.test{path}"))
        .body(())
        .expect("request")
}

/// Reads a whole response body, releasing flow-control capacity as it goes.
async fn read_body(mut body: RecvStream) -> Vec<u8> {
    read_data(&mut body).await
}

/// Reads a body's DATA to its end (its trailers, if any, are next).
async fn read_data(body: &mut RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Sends a body-less GET and waits for the response head.
async fn send_get(client: &mut SendRequest<Bytes>, path: &str) -> http::Response<RecvStream> {
    let (response, _) = client
        .send_request(request(Method::GET, path), true)
        .expect("send request");
    response.await.expect("response")
}

/// Sends a body-less request and returns (status, body).
async fn get(client: &mut SendRequest<Bytes>, method: Method, path: &str) -> (StatusCode, Vec<u8>) {
    let (response, _) = client
        .send_request(request(method, path), true)
        .expect("send request");
    let response = response.await.expect("response");
    let status = response.status();
    (status, read_body(response.into_body()).await)
}

#[tokio::test]
async fn multiplexed_requests_each_get_their_own_response() {
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    let (client, _conn) = connect(weir.addr).await;
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (status, body) = get(&mut client, Method::GET, &format!("/item/{i}?q={i}")).await;
            (i, status, String::from_utf8_lossy(&body).into_owned())
        }));
    }
    for t in tasks {
        let (i, status, body) = t.await.expect("task");
        assert_eq!(status, StatusCode::OK);
        // The echo backend answers with the request head it received, in HTTP/1.1.
        assert!(
            body.starts_with(&format!("GET /item/{i}?q={i} HTTP/1.1\r\n")),
            "{body}"
        );
        assert!(
            body.contains("\r\nhost: example.test\r\n")
                || body.contains("\r\nHost: example.test\r\n"),
            "{body}"
        );
        assert!(body.contains("X-Forwarded-For: 127.0.0.1\r\n"), "{body}");
    }
    // A stream is counted after its answer went out: wait for the last one.
    let requests = "weir_requests_total{listener=\"web\",route=\"all\",method=\"GET\",code=\"200\",protocol=\"HTTP/2.0\"}";
    weir.wait_metric(requests, 32).await;
    assert_eq!(
        weir.metric("weir_http2_connections_total{listener=\"web\"}"),
        1
    );
    assert_eq!(
        weir.metric("weir_http2_streams_total{listener=\"web\"}"),
        32
    );
}

/// A field name with `"` (the `h2` crate takes it; it is not an HTTP/1.1 token) makes the
/// request malformed: its stream is reset with PROTOCOL_ERROR (RFC 9113 8.1.1) before
/// anything reaches the HTTP/1.1 upstream, and the connection serves on.
#[tokio::test]
async fn a_field_name_that_is_not_a_token_resets_the_stream() {
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for name in [&b"x\"y"[..], b"\""] {
        let mut req = request(Method::GET, "/quoted");
        let name = http::HeaderName::from_lowercase(name).expect("an HTTP/2 field name");
        req.headers_mut()
            .insert(name, http::HeaderValue::from_static("1"));
        let (response, _) = client.send_request(req, true).expect("send request");
        let reset = response.await.expect_err("a reset stream");
        assert_eq!(reset.reason(), Some(Reason::PROTOCOL_ERROR), "{reset}");
    }
    assert_eq!(backend.connections_accepted(), 0);
    let (status, body) = get(&mut client, Method::GET, "/after").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with(b"GET /after HTTP/1.1\r\n"));
    assert_eq!(backend.requests_served(), 1);
}

#[tokio::test]
async fn request_bodies_with_and_without_content_length() {
    let backend = Backend::sink();
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    let data = pattern_vec(300_000);
    for with_length in [true, false] {
        let mut req = request(Method::POST, "/upload");
        if with_length {
            req.headers_mut()
                .insert("content-length", data.len().into());
        }
        let (response, mut send) = client.send_request(req, false).expect("send");
        // Several DATA frames, each waiting for window: the upload follows flow control.
        for piece in data.chunks(70_000) {
            send.reserve_capacity(piece.len());
            let mut left = Bytes::copy_from_slice(piece);
            while !left.is_empty() {
                let cap = std::future::poll_fn(|cx| send.poll_capacity(cx))
                    .await
                    .expect("capacity")
                    .expect("capacity ok");
                let n = cap.min(left.len());
                send.send_data(left.split_to(n), false).expect("data");
            }
        }
        send.send_data(Bytes::new(), true).expect("end");
        let response = response.await.expect("response");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "with_length {with_length}"
        );
        let body = read_body(response.into_body()).await;
        let mut h = Hasher::new();
        h.update(&data);
        assert_eq!(
            String::from_utf8_lossy(&body),
            sink_summary(data.len() as u64, h.finish()),
            "with_length {with_length}"
        );
    }
}

#[tokio::test]
async fn large_response_streams_under_flow_control() {
    let len = 8 << 20;
    let backend = Backend::huge(len);
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    let response = send_get(&mut client, "/big").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-length"],
        len.to_string().as_str()
    );
    let mut body = response.into_body();
    let mut hasher = Hasher::new();
    // Reading slowly at first: Weir may only send what the default 64 KiB window allows.
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("chunk");
        hasher.update(&chunk);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert_eq!(hasher.finish(), pattern_hash(len));
}

/// A response body that streams for longer than the upstream's `idle_timeout` (the client
/// holds it back) leaves a connection idle from the relay's end, not from the head's
/// arrival: the next request reuses it.
#[tokio::test]
async fn a_connection_busy_streaming_past_idle_timeout_is_reused() {
    let len = 1 << 20;
    let backend = Backend::huge(len);
    let weir = Conf::new()
        .route("all", "up", &[])
        // The pooled connection must outlive the gap between the relay's end and the next
        // request: 300 ms was little margin for that on a loaded two-core machine.
        .upstream("up", &[backend.addr()], &["idle_timeout = \"1s\""])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let response = send_get(&mut client, "/big").await;
    assert_eq!(response.status(), StatusCode::OK);
    // The body waits on the client's window while more than idle_timeout passes: the time
    // passing is the condition, so a sleep.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let mut hasher = Hasher::new();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("chunk");
        hasher.update(&chunk);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert_eq!(hasher.finish(), pattern_hash(len));
    let (status, body) = get(&mut client, Method::GET, "/big").await;
    assert_eq!((status, body.len() as u64), (StatusCode::OK, len));
    assert_eq!(
        backend.connections_accepted(),
        1,
        "the pooled connection is reused"
    );
}

#[tokio::test]
async fn head_has_no_body_but_its_length() {
    let backend = Backend::fixed(200, &[("X-A", "1")], "hello world");
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (response, _) = client
        .send_request(request(Method::HEAD, "/"), true)
        .expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-length"], "11");
    assert_eq!(response.headers()["x-a"], "1");
    assert!(response.headers().get("connection").is_none());
    assert!(read_body(response.into_body()).await.is_empty());
    let (status, body) = get(&mut client, Method::GET, "/").await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::OK, &b"hello world"[..])
    );
}

#[tokio::test]
async fn no_route_gets_the_default_response() {
    let backend = Backend::echo("e");
    let weir = Conf::new()
        .listener("default_response = { status = 421, body = \"nothing here\\n\" }")
        .route("api", "up", &["path_prefix = \"/api/\""])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, body) = get(&mut client, Method::GET, "/other").await;
    assert_eq!(status.as_u16(), 421);
    assert_eq!(body, b"nothing here\n");
    let (status, _) = get(&mut client, Method::GET, "/api/x").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(backend.requests_served(), 1);
}

#[tokio::test]
async fn upstream_down_is_502_and_the_connection_stays_usable() {
    let dead = dead_port();
    let weir = single(dead.addr).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for _ in 0..2 {
        let (status, body) = get(&mut client, Method::GET, "/").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(body, b"Bad Gateway\n");
    }
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_504_within_response_timeout() {
    let backend = Backend::hang();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["response_timeout = \"200ms\""])
        .start();
    let (mut client, conn) = connect(weir.addr).await;
    // Two streams at once: each has its own deadline (a timer per stream).
    let mut other = client.clone();
    let both = async {
        tokio::join!(
            get(&mut other, Method::GET, "/a"),
            get(&mut client, Method::GET, "/b")
        )
    };
    let (first, second) = tokio::time::timeout(WAIT, both)
        .await
        .expect("answered within the response timeout");
    for (status, body) in [first, second] {
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body, b"Gateway Timeout\n");
    }
    // Both requests reached the backend (it may count the second a moment after the 504s).
    assert!(
        wait_until_async(WAIT, || backend.requests_served() == 2).await,
        "served {}",
        backend.requests_served()
    );
    assert!(!conn.is_finished());
}

/// The wait for the response head uses a timer kept from stream to stream (the worker's
/// exchange scratch): each stream's own deadline counts, whether it is earlier or later
/// than the last stream's.
#[tokio::test]
async fn response_timeouts_hold_for_streams_that_reuse_a_timer() {
    let slow = Backend::slow(Duration::from_millis(300));
    let hang = Backend::hang();
    let weir = Conf::new()
        .route("slow", "slow", &["path_prefix = \"/slow/\""])
        .route("hang", "hang", &["path_prefix = \"/hang/\""])
        .upstream("slow", &[slow.addr()], &["response_timeout = \"60s\""])
        .upstream("hang", &[hang.addr()], &["response_timeout = \"200ms\""])
        .start();
    let (mut client, conn) = connect(weir.addr).await;
    // A deadline 60 s away, then one 200 ms away: the timer is moved earlier.
    assert_eq!(
        get(&mut client, Method::GET, "/slow/1").await.0,
        StatusCode::OK
    );
    let hung = tokio::time::timeout(WAIT, get(&mut client, Method::GET, "/hang/1")).await;
    let (status, _) = hung.expect("504 within the hang upstream's response timeout");
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    // After a deadline that passed, one 60 s away: an answer that takes longer than the
    // last stream's 200 ms is not cut short.
    let (status, body) = get(&mut client, Method::GET, "/slow/2").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(!conn.is_finished());
}

#[tokio::test]
async fn client_resets_cancel_their_upstream_requests() {
    let backend = Backend::hang();
    let weir = single(backend.addr()).start();
    let (mut client, conn) = connect(weir.addr).await;
    let mut streams = Vec::new();
    for i in 0..5 {
        let (response, send) = client
            .send_request(request(Method::GET, &format!("/{i}")), true)
            .expect("send");
        streams.push((response, send));
    }
    assert!(
        wait_until_async(WAIT, || backend.requests_served() == 5).await,
        "served {}",
        backend.requests_served()
    );
    assert_eq!(backend.in_flight(), 5);
    for (_, send) in &mut streams {
        send.send_reset(Reason::CANCEL);
    }
    // Each reset closed its upstream connection: the backend sees the requests end.
    assert!(
        wait_until_async(WAIT, || backend.in_flight() == 0).await,
        "in flight {}",
        backend.in_flight()
    );
    // A reset stream is counted when its task ends, which may be after the upstream
    // connection it closed: wait for the last count.
    let cancelled = "weir_requests_total{listener=\"web\",route=\"all\",method=\"GET\",code=\"499\",protocol=\"HTTP/2.0\"}";
    weir.wait_metric(cancelled, 5).await;
    assert_eq!(
        weir.metric("weir_http2_client_resets_total{listener=\"web\"}"),
        5
    );
    assert_eq!(backend.requests_served(), 5);
    // Within budget: the connection still works.
    assert!(!conn.is_finished());
}

#[tokio::test]
async fn rapid_reset_past_the_budget_gets_goaway_enhance_your_calm() {
    let backend = Backend::hang();
    let weir = single(backend.addr())
        .listener("http2 = { reset_budget = 5, reset_window = \"60s\" }")
        .start();
    let (mut client, conn) = connect(weir.addr).await;
    let mut resets = 0;
    for i in 0..20 {
        let Ok((_, mut send)) = client.send_request(request(Method::GET, &format!("/{i}")), true)
        else {
            break;
        };
        // Reset each stream once Weir has sent it upstream: the costly kind of reset,
        // which h2's own pending-accept guard does not see.
        if !wait_until_async(WAIT, || backend.requests_served() == i + 1).await {
            break;
        }
        send.send_reset(Reason::CANCEL);
        resets += 1;
        if conn.is_finished() {
            break;
        }
        // Wait until Weir has seen this reset (or closed the connection).
        let seen =
            || weir.metric("weir_http2_client_resets_total{listener=\"web\"}") == resets as u64;
        assert!(wait_until_async(WAIT, || seen() || conn.is_finished()).await);
        if conn.is_finished() {
            break;
        }
    }
    let ended = tokio::time::timeout(WAIT, conn)
        .await
        .expect("connection closed")
        .expect("task");
    let error = ended.expect_err("GOAWAY");
    assert!(error.is_go_away(), "{error:?}");
    assert_eq!(error.reason(), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(resets, 6, "the sixth reset is one past a budget of five");
    // Every request Weir sent upstream was cancelled: upstream cancellations == resets.
    assert!(wait_until_async(WAIT, || backend.in_flight() == 0).await);
    assert_eq!(backend.requests_served(), resets);
    assert_eq!(
        weir.metric("weir_http2_client_resets_total{listener=\"web\"}"),
        resets as u64
    );
    assert_eq!(
        weir.metric("weir_http2_calm_goaways_total{listener=\"web\"}"),
        1
    );
}

#[tokio::test]
async fn http1_clients_share_the_listener() {
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    let (mut h2client, _conn) = connect(weir.addr).await;
    let mut h1 = weir.client().await;
    let r = h1.get("/one", "h").await.expect("h1 response");
    assert_eq!(r.status, 200);
    // PUT, POST and PATCH start with 'P' like the preface: still HTTP/1.1.
    for method in ["POST", "PUT", "PATCH"] {
        let req = format!(
            "{method} /p HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
        );
        let raw = weir_testkit::send_raw_once(weir.addr, req.as_bytes())
            .await
            .expect("raw");
        assert_eq!(weir_testkit::status_of(&raw), Some(200), "{method}");
    }
    let (status, _) = get(&mut h2client, Method::GET, "/two").await;
    assert_eq!(status, StatusCode::OK);
    let r = h1.get("/three", "h").await.expect("h1 response");
    assert_eq!(r.status, 200);
}

/// The per-request series carry the client's protocol, spelled as in the access log;
/// HTTP/1.0 counts with HTTP/1.1.
#[tokio::test]
async fn http1_and_h2c_requests_count_under_their_protocol() {
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    let raw = weir_testkit::send_raw_once(
        weir.addr,
        b"GET /one HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("HTTP/1.1");
    assert_eq!(weir_testkit::status_of(&raw), Some(200));
    let raw = weir_testkit::send_raw_once(weir.addr, b"GET /old HTTP/1.0\r\nHost: h\r\n\r\n")
        .await
        .expect("HTTP/1.0");
    assert_eq!(weir_testkit::status_of(&raw), Some(200));
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, _) = get(&mut client, Method::GET, "/two").await;
    assert_eq!(status, StatusCode::OK);
    let series = |p: &str| {
        format!("weir_requests_total{{listener=\"web\",route=\"all\",method=\"GET\",code=\"200\",protocol=\"{p}\"}}")
    };
    let duration = |p: &str| {
        format!("weir_request_duration_seconds_count{{listener=\"web\",route=\"all\",protocol=\"{p}\"}}")
    };
    // The duration is observed apart from the request counter: both are polled.
    let counted = || {
        weir.metric_now(&series("HTTP/1.1")) == Some(2)
            && weir.metric_now(&series("HTTP/2.0")) == Some(1)
            && weir.metric_now(&duration("HTTP/1.1")) == Some(2)
            && weir.metric_now(&duration("HTTP/2.0")) == Some(1)
    };
    assert!(
        wait_until_async(WAIT, counted).await,
        "{}",
        weir.metrics_text()
    );
    let text = weir.metrics_text();
    let requests: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("weir_requests_total{"))
        .collect();
    assert_eq!(requests.len(), 2, "{text}");
    assert!(!text.contains("HTTP/1.0"), "{text}");
}

#[tokio::test]
async fn drain_sends_goaway_and_lets_streams_finish() {
    let backend = Backend::slow(Duration::from_millis(300));
    // The harness drains for 0 s; this test needs time for the in-flight stream.
    let toml = single(backend.addr())
        .toml()
        .replace("drain_timeout = \"0s\"", "drain_timeout = \"30s\"");
    let config = weir_config::parse_str(&toml, "drain.toml").expect("config");
    let proxy = weir_core::Proxy::start(config, 1).expect("start");
    let addr = proxy.listener_addr(common::LISTENER).expect("address");
    let (mut client, conn) = connect(addr).await;
    let (response, _) = client
        .send_request(request(Method::GET, "/slow"), true)
        .expect("send");
    assert!(wait_until_async(WAIT, || backend.requests_served() == 1).await);
    let weir_thread = std::thread::spawn(move || proxy.shutdown());
    let response = response.await.expect("in-flight stream finishes");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(read_body(response.into_body())
        .await
        .starts_with(b"GET /slow HTTP/1.1\r\n"));
    let ended = tokio::time::timeout(WAIT, conn)
        .await
        .expect("connection closed")
        .expect("task");
    assert!(ended.is_ok(), "graceful GOAWAY (NO_ERROR): {ended:?}");
    weir_thread.join().expect("shutdown");
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body() {
    let backend = Backend::sink();
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    let mut req = request(Method::POST, "/upload");
    req.headers_mut()
        .insert("expect", http::HeaderValue::from_static("100-continue"));
    req.headers_mut().insert("content-length", 5.into());
    let (mut response, mut send) = client.send_request(req, false).expect("send");
    // Like curl, the client holds the body until it has the 100.
    let interim = common::first_interim(&mut response).await;
    assert_eq!(interim.status(), StatusCode::CONTINUE);
    send.send_data(Bytes::from_static(b"hello"), true)
        .expect("body");
    // The backend answers `expect` with its own 100 too: the client gets only Weir's.
    let answer = common::read_with_interims(response).await;
    assert!(answer.interims.is_empty(), "{:?}", answer.interims);
    assert_eq!(answer.head.status(), StatusCode::OK);
    let mut h = Hasher::new();
    h.update(b"hello");
    assert_eq!(answer.body, sink_summary(5, h.finish()).into_bytes());
}

/// An HTTP/1.1 upstream's 103 Early Hints reaches an h2 client as an informational HEADERS
/// frame, with its Link, before the final response; hop-by-hop fields stay behind.
#[tokio::test]
async fn early_hints_from_an_http1_upstream_reach_the_h2_client() {
    let backend = Backend::raw_response(
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (response, _) = client
        .send_request(request(Method::GET, "/page"), true)
        .expect("send");
    let answer = common::read_with_interims(response).await;
    assert_eq!(answer.interims.len(), 1, "{:?}", answer.interims);
    let hints = &answer.interims[0];
    assert_eq!(hints.status(), StatusCode::EARLY_HINTS);
    assert_eq!(hints.headers()["link"], "</style.css>; rel=preload");
    for hop in ["connection", "x-hop", "keep-alive"] {
        assert!(
            !hints.headers().contains_key(hop),
            "{hop}: {:?}",
            hints.headers()
        );
    }
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.body, b"ok");
}

/// An upstream that sends a 103 and then closes: the client has part of the response, so
/// the request is not tried on another server (as for HTTP/1.1 clients); the client gets
/// the 103, then 502.
#[tokio::test]
async fn a_failure_after_relayed_hints_is_not_retried() {
    let hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n";
    let (a, b) = (Backend::raw_response(hints), Backend::raw_response(hints));
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream(
            "up",
            &[a.addr(), b.addr()],
            &[
                "[upstreams.up.passive]\nmax_fails = 0",
                "[upstreams.up.retry]\nattempts = 1\non = [\"reset_before_response\"]",
            ],
        )
        .start();
    let answer = get_with_interims(&weir, "/page").await;
    assert_eq!(answer.interims.len(), 1, "{:?}", answer.interims);
    assert_eq!(answer.head.status(), StatusCode::BAD_GATEWAY);
    // Counted when the request head is read: final once the client has its answer.
    assert_eq!(a.requests_served() + b.requests_served(), 1, "retried");
}

/// An HTTP/1.1 upstream answering 101 to a request that offered no upgrade: HTTP/2 has
/// no such final status, so the client gets 502 (the upstream's error), and its
/// connection stays usable.
#[tokio::test]
async fn an_unsolicited_101_is_502() {
    let backend = Backend::raw_response(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    );
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for path in ["/one", "/two"] {
        let (status, _) = get(&mut client, Method::GET, path).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{path}");
    }
    let upstream = format!(
        "weir_upstream_requests_total{{upstream=\"up\",server=\"{}\",code=\"502\"}}",
        backend.addr()
    );
    assert_eq!(weir.metric(&upstream), 2);
}

/// Sends a body-less GET of `path` and returns (status, body, trailers).
async fn get_with_trailers(
    client: &mut SendRequest<Bytes>,
    path: &str,
) -> (StatusCode, Vec<u8>, Option<http::HeaderMap>) {
    let response = send_get(client, path).await;
    let status = response.status();
    let mut body = response.into_body();
    let out = read_data(&mut body).await;
    let trailers = body.trailers().await.expect("trailers");
    (status, out, trailers)
}

/// A chunked HTTP/1.1 response's trailer reaches an h2 client as trailing HEADERS, on
/// every response of a reused upstream connection.
#[tokio::test]
async fn chunked_trailers_from_an_http1_upstream_reach_the_h2_client() {
    let backend = Backend::chunked(&["hello", " ", "world"]);
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for path in ["/one", "/two"] {
        let (status, body, trailers) = get_with_trailers(&mut client, path).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello world"[..]));
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers.len(), 1, "{trailers:?}");
        assert_eq!(trailers["x-trailer"], "done");
    }
}

/// Trailer fields that may not be trailers (framing, routing, hop-by-hop, those the head's
/// `Connection` lists) and those past `max_header_list_size` are dropped; the rest, the body and the stream's end come
/// through. Only forbidden fields: the stream ends without trailers.
#[tokio::test]
async fn forbidden_and_oversized_trailers_are_dropped_not_fatal() {
    let big = "v".repeat(2000);
    let raw = format!(
        "HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nTransfer-Encoding: chunked\r\n\r\n\
         2\r\nok\r\n0\r\nX-Big: {big}\r\nContent-Length: 99\r\nHost: evil.test\r\n\
         Connection: close\r\nX-Hop: 1\r\nX-Keep: 1\r\n\r\n"
    );
    let backend = Backend::raw_response(raw.as_bytes());
    let only_forbidden = Backend::raw_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\
          Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
    );
    let weir = Conf::new()
        .listener("http2 = { max_header_list_size = \"1KiB\" }")
        .route("mixed", "mixed", &["path_prefix = \"/mixed\""])
        .route("rest", "forbidden", &[])
        .upstream("mixed", &[backend.addr()], &[])
        .upstream("forbidden", &[only_forbidden.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, body, trailers) = get_with_trailers(&mut client, "/mixed").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let trailers = trailers.expect("trailers");
    let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-keep"]);
    let (status, body, trailers) = get_with_trailers(&mut client, "/other").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(trailers, None);
}

/// Sends a POST of `body` with the trailer fields `trailers` on `client` (a
/// `content-length` when `length`), the trailers once `arrived` (if any) says the
/// upstream has the first body bytes, and returns the response's status and body.
async fn post_with_trailers(
    client: &mut SendRequest<Bytes>,
    length: bool,
    trailers: &[(&'static str, &'static str)],
    arrived: Option<&mut tokio::sync::mpsc::UnboundedReceiver<()>>,
) -> (StatusCode, Vec<u8>) {
    let mut req = request(Method::POST, if length { "/length" } else { "/up" });
    if length {
        req.headers_mut().insert("content-length", 3.into());
    }
    let (response, mut up) = client.send_request(req, false).expect("send request");
    up.send_data(Bytes::from_static(b"abc"), false)
        .expect("data");
    if let Some(arrived) = arrived {
        arrived.recv().await.expect("first body bytes upstream");
    }
    let fields = trailers
        .iter()
        .map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap()));
    up.send_trailers(fields.collect()).expect("trailers");
    let response = response.await.expect("response");
    (response.status(), read_body(response.into_body()).await)
}

/// An HTTP/2 client's trailer fields reach an HTTP/1.1 upstream in the chunked body's
/// trailer section, less the fields no trailer may carry and the names the request head
/// does not carry as they came (as for an HTTP/1.1 client's: an upstream that merges
/// trailers into the head would take them for Weir's). A body with a `content-length` has
/// no trailer section: its trailers stay out and the request goes through whole.
#[tokio::test]
async fn a_clients_trailers_reach_an_http1_upstream_in_the_chunked_body() {
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let raw = common::echoing_raw_chunked(arrived);
    let echo = Backend::echo("e");
    let weir = Conf::new()
        .with_request_ids()
        .route("length", "echo", &["path_prefix = \"/length\""])
        .route(
            "all",
            "raw",
            &[r#"request_headers = { set = { "X-User" = "weir" } }"#],
        )
        .upstream("raw", &[raw], &[])
        .upstream("echo", &[echo.addr()], &[])
        .start();
    let trailers = [
        ("x-sum", "1"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-request-id", "forged"),
        ("x-user", "admin"),
        ("cookie", "c=1"),
        ("x-client-trailer", "kept"),
    ];
    let (mut client, _conn) = connect(weir.addr).await;
    for streamed in [false, true] {
        let waits = streamed.then_some(&mut arrivals);
        let (status, got) = post_with_trailers(&mut client, false, &trailers, waits).await;
        assert_eq!(status, StatusCode::OK);
        let got = String::from_utf8_lossy(&got);
        let (_, body) = got.split_once("\r\n\r\n").expect("a head");
        assert_eq!(
            body, "3\r\nabc\r\n0\r\nx-sum: 1\r\nx-client-trailer: kept\r\n\r\n",
            "streamed: {streamed}"
        );
        assert!(got.contains("\r\nX-User: weir\r\n"), "{got}");
        if !streamed {
            arrivals.recv().await.expect("the first request's arrival");
        }
    }
    let (status, got) = post_with_trailers(&mut client, true, &trailers, None).await;
    assert_eq!(status, StatusCode::OK);
    let got = String::from_utf8_lossy(&got);
    assert!(got.ends_with("\r\n\r\nabc"), "{got}");
    assert!(!got.contains("x-sum") && !got.contains("kept"), "{got}");
}

/// A GET of `path` on a new h2c connection: its 1xx heads, final head and body.
async fn get_with_interims(weir: &common::Weir, path: &str) -> common::WithInterims {
    let (mut client, _conn) = connect(weir.addr).await;
    let (response, _) = client
        .send_request(request(Method::GET, path), true)
        .expect("send");
    common::read_with_interims(response).await
}

/// The `Link`s of the 1xx heads an h2 client gets when the upstream sends `hints` 103s
/// (`Link: </i>`) before a 200, under the listener's `http2` settings `h2`; the final
/// response must come through whole.
async fn links_relayed(hints: usize, h2: &str) -> Vec<http::HeaderValue> {
    let mut raw = Vec::new();
    for i in 0..hints {
        raw.extend_from_slice(
            format!("HTTP/1.1 103 Early Hints\r\nLink: </{i}>\r\n\r\n").as_bytes(),
        );
    }
    raw.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let backend = Backend::raw_response(&raw);
    let weir = single(backend.addr())
        .listener(&format!("http2 = {{ {h2} }}"))
        .start();
    let answer = get_with_interims(&weir, "/").await;
    assert_eq!(
        (answer.head.status(), &answer.body[..]),
        (StatusCode::OK, &b"ok"[..])
    );
    answer
        .interims
        .iter()
        .map(|h| h.headers()["link"].clone())
        .collect()
}

/// The 1xx heads of a response may take `max_header_list_size` in all: past it, they are
/// dropped (each 103 here is `:status` 42 + `link` 40 or 41 bytes as HTTP/2 counts them:
/// 12 fit in 1 KiB).
#[tokio::test]
async fn informational_heads_past_max_header_list_size_are_dropped() {
    let links = links_relayed(
        20,
        "max_informational = 100, max_header_list_size = \"1KiB\"",
    )
    .await;
    assert_eq!(links.len(), 12, "{links:?}");
    assert_eq!(links[11], "</11>");
}

/// An upstream sending 1xx heads in a loop gets `max_informational` of them relayed; the
/// final response still comes through.
#[tokio::test]
async fn informational_heads_past_max_informational_are_dropped() {
    let links = links_relayed(5, "max_informational = 2").await;
    assert_eq!(links, ["</0>", "</1>"]);
}

/// An upstream looping on 103 cannot hold an h2 stream until `response_timeout`: past the
/// larger of the listener's `max_informational` and `http2.max_informational`, the
/// client gets 502 after the 1xx already relayed (and up to that bound, the final head).
#[tokio::test]
async fn an_upstream_looping_on_103_gets_the_h2_client_a_502() {
    let mut raw = Vec::new();
    for i in 0..10 {
        raw.extend_from_slice(
            format!("HTTP/1.1 103 Early Hints\r\nLink: </{i}>\r\n\r\n").as_bytes(),
        );
    }
    raw.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let backend = Backend::raw_response(&raw);
    let cases = [
        (
            "max_informational = 9",
            "max_informational = 2",
            StatusCode::BAD_GATEWAY,
            2,
        ),
        (
            "max_informational = 3",
            "max_informational = 9",
            StatusCode::BAD_GATEWAY,
            9,
        ),
        (
            "max_informational = 10",
            "max_informational = 2",
            StatusCode::OK,
            2,
        ),
    ];
    for (listener, h2, status, relayed) in cases {
        let weir = single(backend.addr())
            .listener(&format!("{listener}\nhttp2 = {{ {h2} }}"))
            .start();
        let answer = get_with_interims(&weir, "/").await;
        assert_eq!(answer.head.status(), status, "{listener}, {h2}");
        assert_eq!(answer.interims.len(), relayed, "{listener}, {h2}");
    }
}

#[tokio::test]
async fn access_log_shows_http_2_0() {
    let dir = std::env::temp_dir().join(format!("weir-h2c-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("access.log");
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(&format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            path.display()
        ))
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, _) = get(&mut client, Method::GET, "/logged?x=1").await;
    assert_eq!(status, StatusCode::OK);
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        wait_until_async(WAIT, || read().ends_with('\n')).await,
        "no log line"
    );
    let line = read();
    let _ = std::fs::remove_dir_all(&dir);
    for field in [
        "\"protocol\":\"HTTP/2.0\"",
        "\"method\":\"GET\"",
        "\"target\":\"/logged?x=1\"",
        "\"status\":200",
        "\"route\":\"all\"",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
}

#[tokio::test]
async fn a_closed_connection_cancels_its_upstream_requests() {
    let backend = Backend::hang();
    let weir = single(backend.addr()).start();
    let (mut client, conn) = connect(weir.addr).await;
    let mut responses = Vec::new();
    for i in 0..3 {
        let req = request(Method::GET, &format!("/{i}"));
        responses.push(client.send_request(req, true).expect("send"));
    }
    assert!(wait_until_async(WAIT, || backend.requests_served() == 3).await);
    // The client goes away without a GOAWAY or a reset: its TCP connection just closes.
    conn.abort();
    drop((client, responses));
    assert!(
        wait_until_async(WAIT, || backend.in_flight() == 0).await,
        "in flight {}",
        backend.in_flight()
    );
    let open = || weir.metric("weir_connections_active{listener=\"web\"}");
    assert!(
        wait_until_async(WAIT, || open() == 0).await,
        "connections open: {}",
        open()
    );
}

#[tokio::test]
async fn content_length_must_match_the_data() {
    let backend = Backend::sink();
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for (declared, sent) in [(10, &b"short"[..]), (2, &b"too long"[..])] {
        let mut req = request(Method::POST, "/upload");
        req.headers_mut().insert("content-length", declared.into());
        let (response, mut send) = client.send_request(req, false).expect("send");
        send.reserve_capacity(sent.len());
        send.send_data(Bytes::copy_from_slice(sent), true)
            .expect("data");
        let error = response.await.expect_err("malformed: the stream is reset");
        assert_eq!(
            error.reason(),
            Some(Reason::PROTOCOL_ERROR),
            "{declared}: {error:?}"
        );
    }
    // Stream errors only: the connection goes on.
    let mut req = request(Method::POST, "/upload");
    req.headers_mut().insert("content-length", 2.into());
    let (response, mut send) = client.send_request(req, false).expect("send");
    send.send_data(Bytes::from_static(b"ok"), true)
        .expect("data");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut h = Hasher::new();
    h.update(b"ok");
    assert_eq!(
        read_body(response.into_body()).await,
        sink_summary(2, h.finish()).into_bytes()
    );
}

#[tokio::test]
async fn an_idle_connection_gets_goaway_after_keepalive_timeout() {
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener("keepalive_timeout = \"200ms\"")
        .start();
    let (mut client, conn) = connect(weir.addr).await;
    let (status, _) = get(&mut client, Method::GET, "/").await;
    assert_eq!(status, StatusCode::OK);
    let ended = tokio::time::timeout(WAIT, conn)
        .await
        .expect("idle connection closed")
        .expect("task");
    assert!(ended.is_ok(), "GOAWAY NO_ERROR: {ended:?}");
    assert!(client
        .send_request(request(Method::GET, "/"), true)
        .is_err());
}

/// HTTP/2 requests are routed and forwarded on the normalised path, like HTTP/1 ones: a dot
/// segment cannot carry a request past its prefix route.
#[tokio::test]
async fn dot_segments_do_not_escape_a_prefix_route() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = Conf::new()
        .route("public", "pub", &["path_prefix = \"/public/\""])
        .route("admin", "adm", &["path_prefix = \"/admin/\""])
        .upstream("pub", &[public.addr()], &[])
        .upstream("adm", &[admin.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, _) = get(&mut client, Method::GET, "/public/../admin/x").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((public.requests_served(), admin.requests_served()), (0, 1));
    let (status, _) = get(&mut client, Method::GET, "/public/%2e%2e/admin/y").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((public.requests_served(), admin.requests_served()), (0, 2));
    let (status, _) = get(&mut client, Method::GET, "/public/../../etc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!((public.requests_served(), admin.requests_served()), (0, 2));
}

/// Issue 24 item 3 over HTTP/2: an escaped control character in `:path` is refused with
/// 400 by the same normaliser as over HTTP/1.1; a raw one is no valid `:path` (the stream
/// is reset); nothing reaches the upstream, and the connection serves on.
#[tokio::test]
async fn control_characters_in_the_path_never_reach_the_upstream() {
    use weir_testkit::h2_raw::{flag, kind, Block, RawH2};
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    let (mut client, _conn) = connect(weir.addr).await;
    for path in ["/a/..%00/etc/passwd", "/a%0A", "/a%7f"] {
        let (status, _) = get(&mut client, Method::GET, path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
    }
    // The `h2` crate's client sends no raw control character in a path: hand-made frames.
    // Bytes past ASCII (`/x\u{ff}`) are no valid request-target either (an HTTP/1.1 request
    // line with them gets 400).
    for path in [
        "/a\x00b",
        "/a\x01b",
        "/a\x7fb",
        "/x\u{ff}",
        "/\u{e9}t\u{e9}",
    ] {
        let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
        let flags = flag::END_HEADERS | flag::END_STREAM;
        let request = Block::get(path).0;
        raw.send_frame(kind::HEADERS, flags, 1, &request)
            .await
            .expect("request");
        let answer = raw
            .until(WAIT, |f| {
                let answer = f.stream == 1 && [kind::HEADERS, kind::RST_STREAM].contains(&f.kind);
                answer.then(|| (f.kind, f.error_code()))
            })
            .await;
        assert_eq!(answer, Some((kind::RST_STREAM, Some(1))), "{path:?}");
    }
    assert_eq!(backend.connections_accepted(), 0);
    let (status, _) = get(&mut client, Method::GET, "/a?q=%00").await;
    assert_eq!(status, StatusCode::OK);
}

/// A route's `respond` and `redirect`, and a weighted split, serve HTTP/2 clients as they
/// serve HTTP/1 ones.
#[tokio::test]
async fn local_answers_and_splits_over_http2() {
    let a = Backend::echo("a");
    let b = Backend::echo("b");
    let weir = Conf::new()
        .route_keys(
            "ping",
            &[
                "path_prefix = \"/ping\"",
                "respond = { status = 200, body = \"pong\\n\", headers = { \"X-Local\" = \"yes\" } }",
            ],
        )
        .route_keys(
            "old",
            &[
                "path_prefix = \"/old/\"",
                "redirect = { to = \"https://{host}{uri}\", status = 301 }",
            ],
        )
        .route_keys(
            "split",
            &[
                "path_prefix = \"/\"",
                "upstreams = [{ name = \"a\", weight = 1 }, { name = \"b\", weight = 1 }]",
            ],
        )
        .upstream("a", &[a.addr()], &[])
        .upstream("b", &[b.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let response = send_get(&mut client, "/ping").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-local"], "yes");
    assert_eq!(read_body(response.into_body()).await, b"pong\n");
    let response = send_get(&mut client, "/old/x?q=1").await;
    assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(
        response.headers()["location"],
        "https://example.test/old/x?q=1"
    );
    for _ in 0..4 {
        let (status, _) = get(&mut client, Method::GET, "/app").await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!((a.requests_served(), b.requests_served()), (2, 2));
}

/// A route's access lists and rate limit (and basic auth, the same check) hold for HTTP/2
/// clients too: h2c with
/// prior knowledge is no way around them.
#[tokio::test]
async fn access_lists_and_rate_limits_hold_over_http2() {
    let backend = Backend::echo("e");
    let weir = Conf::new()
        .route_keys(
            "denied",
            &[
                "path_prefix = \"/denied/\"",
                "upstream = \"up\"",
                "deny = [\"127.0.0.0/8\"]",
            ],
        )
        .route_keys(
            "limited",
            &[
                "path_prefix = \"/limited/\"",
                "upstream = \"up\"",
                "rate_limit = { rate = \"1/h\", burst = 2, key = \"client_ip\" }",
            ],
        )
        .route_keys("open", &["path_prefix = \"/\"", "upstream = \"up\""])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let (status, _) = get(&mut client, Method::GET, "/denied/x").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(backend.requests_served(), 0);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = send_get(&mut client, "/limited/x").await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(response.headers().contains_key("retry-after"));
        }
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(backend.requests_served(), 2);
    let (status, _) = get(&mut client, Method::GET, "/open").await;
    assert_eq!(status, StatusCode::OK);
    // An HTTP/1.1 request refused on the same route: one series per client protocol.
    let mut http1 = weir.client().await;
    assert_eq!(http1.get("/limited/x", "h").await.expect("429").status, 429);
    let limited = |protocol: &str| {
        format!(
            "weir_rate_limited_total{{listener=\"web\",route=\"limited\",protocol=\"{protocol}\"}}"
        )
    };
    // Polled: the HTTP/2.0 row shows once a stream on the route was recorded, which is
    // after its answer was sent.
    weir.wait_metric(&limited("HTTP/2.0"), 1).await;
    assert_eq!(weir.metric(&limited("HTTP/1.1")), 1);
}

/// Behind `trusted_proxies`, an HTTP/2 stream's client is the address the proxy names in
/// X-Forwarded-For, as for HTTP/1: a deny list cannot be passed by going through the proxy.
#[tokio::test]
async fn trusted_proxies_name_the_client_of_an_http2_stream() {
    let backend = Backend::echo("e");
    let weir = Conf::new()
        .listener("trusted_proxies = [\"127.0.0.0/8\"]")
        .route_keys(
            "guarded",
            &[
                "path_prefix = \"/\"",
                "upstream = \"up\"",
                "deny = [\"10.9.0.0/16\"]",
            ],
        )
        .upstream("up", &[backend.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let ask = |xff: &'static str| {
        let mut req = request(Method::GET, "/x");
        req.headers_mut()
            .insert("x-forwarded-for", http::HeaderValue::from_static(xff));
        req
    };
    let (response, _) = client.send_request(ask("10.9.1.1"), true).expect("send");
    assert_eq!(
        response.await.expect("response").status(),
        StatusCode::FORBIDDEN
    );
    let (response, _) = client.send_request(ask("10.1.1.1"), true).expect("send");
    assert_eq!(response.await.expect("response").status(), StatusCode::OK);
    assert_eq!(backend.requests_served(), 1);
}

/// Behind `trusted_proxies`, `hash_key = "client_ip"` hashes an HTTP/2 stream's client as
/// named in X-Forwarded-For, not the front proxy every stream comes from.
#[tokio::test]
async fn consistent_hash_on_client_ip_uses_the_client_behind_trusted_proxies() {
    let backends = [
        Backend::echo("a"),
        Backend::echo("b"),
        Backend::echo("c"),
        Backend::echo("d"),
    ];
    let addrs: Vec<_> = backends.iter().map(|b| b.addr()).collect();
    let weir = Conf::new()
        .listener("trusted_proxies = [\"127.0.0.0/8\"]")
        .route("all", "up", &[])
        .upstream(
            "up",
            &addrs,
            &["lb = \"consistent_hash\"", "hash_key = \"client_ip\""],
        )
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let mut backend_for = |xff: String| {
        let mut req = request(Method::GET, "/x");
        req.headers_mut()
            .insert("x-forwarded-for", xff.parse().expect("value"));
        let (response, _) = client.send_request(req, true).expect("send");
        async move {
            let response = response.await.expect("response");
            assert_eq!(response.status(), StatusCode::OK);
            let name = response.headers().get("x-backend").expect("x-backend");
            name.to_str().expect("ascii").to_string()
        }
    };
    let mut used = std::collections::HashSet::new();
    for n in 0..16 {
        let first = backend_for(format!("10.0.{n}.7")).await;
        let again = backend_for(format!("10.0.{n}.7")).await;
        assert_eq!(again, first);
        used.insert(first);
    }
    assert!(used.len() >= 2, "clients spread over servers: {used:?}");
}

/// A route's request-header rules, the request id and the client behind trusted proxies
/// reach the upstream from HTTP/2 streams as from HTTP/1 requests: a `remove` of an internal
/// header is no weaker over h2c.
#[tokio::test]
async fn request_header_rules_and_ids_apply_to_http2_streams() {
    let backend = Backend::echo("e");
    let weir = Conf::new()
        .with_request_ids()
        .listener("trusted_proxies = [\"127.0.0.0/8\"]")
        .route_keys(
            "app",
            &[
                "path_prefix = \"/\"",
                "upstream = \"up\"",
                "request_headers = { set = { \"X-Env\" = \"{scheme}-prod\" }, remove = [\"X-Internal-User\"] }",
            ],
        )
        .upstream("up", &[backend.addr()], &[])
        .start();
    let (mut client, _conn) = connect(weir.addr).await;
    let mut req = request(Method::GET, "/x");
    let headers = req.headers_mut();
    headers.insert("x-internal-user", http::HeaderValue::from_static("admin"));
    headers.insert(
        "x-forwarded-for",
        http::HeaderValue::from_static("192.0.2.9"),
    );
    let (response, _) = client.send_request(req, true).expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let seen = String::from_utf8_lossy(&read_body(response.into_body()).await).to_lowercase();
    assert!(!seen.contains("x-internal-user"), "{seen}");
    assert!(seen.contains("x-env: http-prod\r\n"), "{seen}");
    assert!(seen.contains("x-request-id: "), "{seen}");
    assert!(seen.contains("x-real-ip: 192.0.2.9\r\n"), "{seen}");
}

/// The DATA frames an h2 client gets for a GET of `/`, and the body bytes they carried.
async fn data_frames_of_one_get(weir: &common::Weir) -> (usize, usize) {
    use weir_testkit::h2_raw::{flag, frame, kind, Block, RawH2};
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let mut out = Vec::new();
    frame(&mut out, kind::SETTINGS, flag::ACK, 0, &[]);
    let block = Block::get("/");
    frame(
        &mut out,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &block.0,
    );
    raw.send(&out).await.expect("request");
    let (mut frames, mut bytes) = (0, 0);
    let ended = raw
        .until(WAIT, |f| {
            if f.kind == kind::DATA && f.stream == 1 {
                frames += 1;
                bytes += f.payload.len();
            }
            let end = matches!(f.kind, kind::DATA | kind::HEADERS) && f.stream == 1;
            (end && f.flags & flag::END_STREAM != 0).then_some(())
        })
        .await;
    assert!(ended.is_some(), "the stream did not end");
    (frames, bytes)
}

/// 1,000 one-byte chunks that arrive together are de-chunked into one piece and relayed
/// as one DATA frame (and the end of the stream), not a frame per chunk: each upstream
/// read is one send, whatever its framing.
#[tokio::test]
async fn a_burst_of_one_byte_chunks_is_relayed_in_one_data_frame() {
    let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..1000 {
        raw.extend_from_slice(b"1\r\nx\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    // One write: the head and the whole body reach Weir's socket at once.
    let backend = Backend::raw_response(&raw);
    let weir = single(backend.addr()).start();
    let (frames, bytes) = data_frames_of_one_get(&weir).await;
    assert_eq!(bytes, 1000);
    assert!(frames <= 2, "{frames} DATA frames");
}
