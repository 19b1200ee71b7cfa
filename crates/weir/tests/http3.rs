//! HTTP/3 on a TLS listener (`http3 = true`): requests over QUIC from the testkit's h3
//! client go through the same routing, policy and upstream exchange as HTTP/1.1 and
//! HTTP/2: bodies both ways, a large download under flow control, trailers, many
//! concurrent streams, the certificate chosen by SNI, redirects and header rules, 502 for
//! an unreachable upstream, `protocol="HTTP/3"` in the metrics, and HTTP/2 upstreams (gRPC
//! streaming both ways, trailers).

mod common;

use std::net::SocketAddr;

use bytes::{Buf, Bytes};
use http::Request;
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::h3_client::{connect_to, get, request, stalled_initial};
use weir_testkit::{pattern_hash, pattern_vec, sink_summary, Backend, H2Backend};

use common::{dead_port, single, tls_table, Conf, Weir};

const NAME: &str = "h3.example.com";

/// Weir with `conf`'s routes on a TLS listener for `leaves` with `http3` as given.
fn start(conf: Conf, leaves: &[&Leaf], http3: &str) -> Weir {
    conf.listener(http3)
        .listener(&tls_table(leaves, ""))
        .start()
}

#[tokio::test]
async fn get_and_post_with_bodies_go_to_an_http1_upstream() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = start(single(backend.addr()), &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/a?b=1").await.expect("GET");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("e"));
    let text = r.text();
    assert!(text.starts_with("GET /a?b=1 HTTP/1.1\r\n"), "{text}");
    assert!(
        text.contains("\r\nhost: h3.example.com\r\n")
            || text.contains("\r\nHost: h3.example.com\r\n"),
        "{text}"
    );
    assert!(
        text.to_ascii_lowercase()
            .contains("x-forwarded-proto: https\r\n"),
        "{text}"
    );
    // With a length: sent as it is.
    let post = Request::post(format!("https://{NAME}/up"))
        .header("content-length", "5")
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, b"hello", None)
        .await
        .expect("POST");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.starts_with("POST /up HTTP/1.1\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
    // Without: chunked upstream.
    let post = Request::post(format!("https://{NAME}/up"))
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, b"streamed body", None)
        .await
        .expect("POST");
    let text = r.text();
    assert!(
        text.to_ascii_lowercase()
            .contains("transfer-encoding: chunked\r\n"),
        "{text}"
    );
    assert!(text.ends_with("streamed body"), "{text}");
    let metrics = weir.metrics_text();
    assert!(metrics.contains("protocol=\"HTTP/3\""), "{metrics}");
}

#[tokio::test]
async fn large_bodies_cross_small_windows_both_ways() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let len: u64 = 8 * 1024 * 1024;
    let down = Backend::huge(len);
    let sink = Backend::sink();
    let conf = Conf::new()
        .route("up", "sink", &["path_prefix = \"/up\""])
        .route("down", "huge", &[])
        .upstream("huge", &[down.addr()], &[])
        .upstream("sink", &[sink.addr()], &[]);
    let small = "http3 = { stream_window = \"16KiB\", connection_window = \"32KiB\" }";
    let weir = start(conf, &[&leaf], small);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/down").await.expect("download");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len() as u64, len);
    assert_eq!(weir_testkit::hash_bytes(&r.body), pattern_hash(len));
    let body = pattern_vec(2 * 1024 * 1024);
    let post = Request::post(format!("https://{NAME}/up"))
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, &body, None)
        .await
        .expect("upload");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        sink_summary(body.len() as u64, pattern_hash(body.len() as u64))
    );
}

#[tokio::test]
async fn response_trailers_reach_the_client() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::chunked(&["one ", "two"]);
    let weir = start(single(backend.addr()), &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/").await.expect("GET");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "one two");
    let trailers = r.trailers.expect("trailers");
    assert_eq!(
        trailers.get("x-trailer").map(|v| v.as_bytes()),
        Some(&b"done"[..])
    );
}

#[tokio::test]
async fn many_concurrent_streams_on_one_connection() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = start(
        single(backend.addr()),
        &[&leaf],
        "http3 = { max_concurrent_streams = 20 }",
    );
    let c = connect_to(&ca, weir.addr, NAME).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut send = c.send.clone();
        tasks.push(tokio::spawn(async move {
            (i, get(&mut send, NAME, &format!("/item/{i}")).await)
        }));
    }
    for task in tasks {
        let (i, r) = task.await.expect("task");
        let r = r.expect("response");
        assert_eq!(r.status, 200);
        assert!(r.text().starts_with(&format!("GET /item/{i} HTTP/1.1\r\n")));
    }
}

#[tokio::test]
async fn the_certificate_is_chosen_by_sni() {
    let ca = TestCa::new("h3 CA");
    let a = ca.leaf(&["a.example.com"]);
    let b = ca.leaf(&["b.example.com"]);
    let backend = Backend::echo("e");
    let weir = start(single(backend.addr()), &[&a, &b], "http3 = true");
    for name in ["a.example.com", "b.example.com"] {
        // The client verifies the name: a wrong certificate fails the handshake.
        let mut c = connect_to(&ca, weir.addr, name).await;
        let r = get(&mut c.send, name, "/").await.expect("GET");
        assert_eq!(r.status, 200);
    }
}

#[tokio::test]
async fn route_policy_applies_redirects_and_header_rules() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let conf = Conf::new()
        .route_keys(
            "moved",
            &["path_prefix = \"/old/\"", r#"redirect = { to = "/new/" }"#],
        )
        .route(
            "all",
            "up",
            &[r#"response_headers = { set = { "X-Env" = "prod" }, remove = ["x-backend"] }"#],
        )
        .upstream("up", &[backend.addr()], &[]);
    let weir = start(conf, &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/old/x").await.expect("GET");
    assert!((300..400).contains(&r.status), "{r:?}");
    assert!(
        r.header("location").is_some_and(|l| l.contains("/new/")),
        "{r:?}"
    );
    let r = get(&mut c.send, NAME, "/other").await.expect("GET");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-env"), Some("prod"));
    assert_eq!(r.header("x-backend"), None);
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_the_connection_serves_on() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let dead = dead_port();
    let weir = start(single(dead.addr), &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    for _ in 0..2 {
        let r = get(&mut c.send, NAME, "/").await.expect("GET");
        assert_eq!(r.status, 502);
        assert_eq!(r.text(), "Bad Gateway\n");
    }
}

/// A port free for both TCP and UDP on 127.0.0.1 right now (the listener binds it next).
fn free_port() -> SocketAddr {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind TCP");
        let addr = tcp.local_addr().expect("address");
        if std::net::UdpSocket::bind(addr).is_ok() {
            return addr;
        }
    }
}

/// The response head of a GET over TLS (HTTP/1.1, ALPN `http/1.1`) to `addr`.
async fn tls_http1_head(ca: &TestCa, addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = (*ca.client_config()).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from(NAME).expect("name");
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let mut s = connector.connect(name, tcp).await.expect("TLS");
    let request = format!("GET / HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn tcp_responses_advertise_http3_with_alt_svc_only_when_it_is_on() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let addr = free_port();
    let on = "http3 = { alt_svc_max_age = \"1h\" }";
    let weir = start(single(backend.addr()).bind(addr), &[&leaf], on);
    let head = tls_http1_head(&ca, weir.addr).await;
    let want = format!("alt-svc: h3=\":{}\"; ma=3600", addr.port());
    assert!(head.to_ascii_lowercase().contains(&want), "{head}");
    // The advertised endpoint answers.
    let mut c = connect_to(&ca, addr, NAME).await;
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    drop((c, weir));
    let weir = start(single(backend.addr()), &[&leaf], "http3 = false");
    let head = tls_http1_head(&ca, weir.addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("alt-svc"), "{head}");
}

#[tokio::test]
async fn retry_validates_addresses_past_the_threshold_and_quic_is_counted() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    // Threshold 0: every new connection must come back with a Retry token.
    let weir = start(
        single(backend.addr()),
        &[&leaf],
        "http3 = { retry_threshold = 0 }",
    );
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    // At least one: on a loaded machine the client may resend its first Initial before the
    // Retry reaches it, and that copy (without a token) is answered with a Retry too.
    let retries = weir.metric("weir_http3_retries_total{listener=\"web\"}");
    assert!(retries >= 1, "{retries} Retry packets");
    assert_eq!(
        weir.metric("weir_http3_handshakes_total{listener=\"web\"}"),
        1
    );
    weir.wait_metric("weir_http3_streams_total{listener=\"web\"}", 1)
        .await;
    // Packets are counted when the connection closes.
    c.connection.close(0u32.into(), b"done");
    drop(c);
    assert!(
        weir_testkit::wait_until_async(common::WAIT, || {
            weir.metric_now("weir_http3_sent_packets_total{listener=\"web\"}")
                .unwrap_or(0)
                > 0
        })
        .await
    );
}

#[tokio::test]
async fn a_quiet_connection_closes_after_idle_timeout() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = start(
        single(backend.addr()),
        &[&leaf],
        "http3 = { idle_timeout = \"300ms\" }",
    );
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    let started = std::time::Instant::now();
    let closed = tokio::time::timeout(common::WAIT, c.connection.closed()).await;
    let reason = closed.expect("closed by the idle timeout");
    assert!(
        matches!(reason, weir_testkit::h3_client::ConnectionError::TimedOut),
        "{reason:?}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
}

#[tokio::test]
async fn streams_past_max_concurrent_streams_wait_their_turn() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::slow(std::time::Duration::from_millis(100));
    let weir = start(
        single(backend.addr()),
        &[&leaf],
        "http3 = { max_concurrent_streams = 4 }",
    );
    let c = connect_to(&ca, weir.addr, NAME).await;
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let mut send = c.send.clone();
        tasks.push(tokio::spawn(async move { get(&mut send, NAME, "/").await }));
    }
    let mut most = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        most = most.max(backend.in_flight());
        tokio::time::sleep(weir_testkit::POLL_INTERVAL).await;
    }
    for task in tasks {
        assert_eq!(task.await.expect("task").expect("response").status, 200);
    }
    assert!((1..=4).contains(&most), "at most 4 at once, saw {most}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_the_streams_in_flight_finish() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::slow(std::time::Duration::from_millis(300));
    let conf = single(backend.addr()).drain_timeout("10s");
    let weir = start(conf, &[&leaf], "http3 = true");
    let c = connect_to(&ca, weir.addr, NAME).await;
    let mut send = c.send.clone();
    let in_flight = tokio::spawn(async move { get(&mut send, NAME, "/slow").await });
    assert!(weir_testkit::wait_until_async(common::WAIT, || backend.in_flight() == 1).await);
    tokio::task::block_in_place(|| weir.proxy().shutdown());
    let r = in_flight
        .await
        .expect("task")
        .expect("the stream in flight finished");
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("GET /slow HTTP/1.1\r\n"));
}

/// The Python with aioquic installed: `$WEIR_AIOQUIC_PYTHON`, else the venv `.ci/run`
/// makes. `None` (the test is skipped) when missing, unless `WEIR_REQUIRE_AIOQUIC` is set.
fn aioquic_python() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("WEIR_AIOQUIC_PYTHON")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(std::path::Path::new(&home).join(".cache/weir-aioquic/bin/python"))
        })?;
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("WEIR_REQUIRE_AIOQUIC").is_none(),
        "{} not found, and WEIR_REQUIRE_AIOQUIC is set",
        path.display()
    );
    eprintln!(
        "SKIPPED: {} not found (.ci/run makes it: a venv with aioquic)",
        path.display()
    );
    None
}

/// A client that is not Weir's (aioquic, bench/h3_interop.py) gets a GET and a POST with a
/// body answered over HTTP/3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aioquic_interoperates() {
    let Some(python) = aioquic_python() else {
        return;
    };
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = start(single(backend.addr()), &[&leaf], "http3 = true");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/h3_interop.py");
    let mut command = std::process::Command::new(python);
    command.arg(script).arg(weir.addr.ip().to_string());
    command
        .arg(weir.addr.port().to_string())
        .arg(NAME)
        .arg(&ca.cert_path);
    // The script bounds each request's wait itself (10 s).
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("aioquic finished")
        .expect("run python");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("aioquic interop: OK"), "{text}");
    assert_eq!(
        weir.metric("weir_http3_handshakes_total{listener=\"web\"}"),
        1
    );
}

/// A body must match its `content-length` (RFC 9114 4.1.2): the h3 crate does not check,
/// and what went past it would reach an HTTP/1.1 upstream as a request of its own.
#[tokio::test]
async fn a_body_that_does_not_match_its_length_is_not_passed_on() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = start(single(backend.addr()), &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let smuggled = b"helloGET /admin HTTP/1.1\r\nHost: internal\r\n\r\n";
    for (length, body) in [("5", &smuggled[..]), ("10", &b"hello"[..])] {
        let post = Request::post(format!("https://{NAME}/up"))
            .header("content-length", length)
            .body(())
            .expect("request");
        let r = request(&mut c.send, post, body, None).await;
        assert!(
            r.as_ref().map_or(true, |r| r.status == 400),
            "length {length}: {:?}",
            r.map(|r| (r.status, r.text()))
        );
    }
    // The connection serves on. The upstream saw the two POST heads (their bodies cut
    // short) and this GET; the smuggled GET /admin would be a fourth.
    let r = get(&mut c.send, NAME, "/after").await.expect("GET");
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("GET /after HTTP/1.1\r\n"));
    assert!(
        backend.requests_served() <= 3,
        "{}",
        backend.requests_served()
    );
}

#[tokio::test]
async fn a_cache_route_stores_misses_and_serves_hits() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "hello");
    let conf = Conf::new()
        .route("c", "up", &[r#"cache = { store = "mem" }"#])
        .upstream("up", &[backend.addr()], &[])
        .table("[caches.mem]\nkind = \"memory\"\n");
    let weir = start(conf, &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    // An HTTP/3 miss is stored as an HTTP/1.1 one is; the next requests are hits.
    let r = get(&mut c.send, NAME, "/").await.expect("GET");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    assert_eq!(r.header("cache-status"), Some("weir; fwd=uri-miss"));
    for _ in 0..2 {
        let r = get(&mut c.send, NAME, "/").await.expect("GET");
        assert_eq!((r.status, r.text().as_str()), (200, "hello"));
        assert_eq!(r.header("cache-status"), Some("weir; hit"));
    }
    // An HTTP/1.1 client is served from the same entry.
    let head = tls_http1_head(&ca, weir.addr).await;
    assert!(head.contains("Cache-Status: weir; hit"), "{head}");
    assert_eq!(
        backend.requests_served(),
        1,
        "hits never reach the upstream"
    );
}

/// Weir routing everything to an h2c `backend` (the testkit's HTTP/2 echo).
fn to_h2c(backend: &H2Backend, leaf: &Leaf) -> Weir {
    let conf = Conf::new().route("all", "up", &[]).upstream(
        "up",
        &[backend.addr()],
        &["protocol = \"h2c\""],
    );
    start(conf, &[leaf], "http3 = true")
}

/// A gRPC message: compression flag, big-endian length, payload.
fn grpc_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn bodies_and_trailers_go_both_ways_to_an_h2c_upstream() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = H2Backend::h2c();
    let weir = to_h2c(&backend, &leaf);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    // Larger than the upstream's windows: flow control on both legs.
    let body = pattern_vec(300_000);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-client-trailer", "from-client".parse().expect("value"));
    let post = Request::post(format!("https://{NAME}/upload"))
        .header("te", "trailers")
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, &body, Some(trailers))
        .await
        .expect("POST");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-method"), Some("POST"));
    assert_eq!(r.header("x-path"), Some("/upload"));
    assert_eq!(r.header("x-te"), Some("trailers"), "te: trailers kept");
    assert!(
        r.body == body,
        "body echoed intact ({} bytes)",
        r.body.len()
    );
    let trailers = r.trailers.expect("trailers");
    assert_eq!(trailers["x-body-len"], "300000");
    assert_eq!(trailers["x-client-trailer"], "from-client");
    // A GET without a body, and the metrics count HTTP/3.
    let r = get(&mut c.send, NAME, "/g").await.expect("GET");
    assert_eq!((r.status, r.header("x-method")), (200, Some("GET")));
    let series = "weir_requests_total{listener=\"web\",route=\"all\",method=\"POST\",code=\"200\",protocol=\"HTTP/3\"}";
    weir.wait_metric(series, 1).await;
}

/// The h3 crate lets any field through in request trailers: those HTTP/2 forbids
/// (connection-specific) and those that may not be trailers are dropped before an h2c
/// upstream's stream, whose trailers would otherwise fail (the request left half-sent).
#[tokio::test]
async fn request_trailers_an_h2_upstream_may_not_take_are_dropped() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = H2Backend::h2c();
    let weir = to_h2c(&backend, &leaf);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-client-trailer", "kept".parse().expect("value"));
    trailers.insert("connection", "close".parse().expect("value"));
    trailers.insert("content-length", "9".parse().expect("value"));
    let post = Request::post(format!("https://{NAME}/upload"))
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, b"body", Some(trailers));
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), r)
        .await
        .expect("answered before the upstream's response timeout")
        .expect("POST");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"body");
    assert_eq!(r.trailers.expect("trailers")["x-client-trailer"], "kept");
}

/// POSTs `body` to `path` with the trailer `fields` over HTTP/3, to a Weir whose listener
/// has a `client_cert_header` (`X-Client-Cert`), before `upstream` (its `keys`).
async fn post_with_trailers(
    upstream: SocketAddr,
    keys: &[&str],
    path: &str,
    fields: &[(&'static str, &'static str)],
) -> weir_testkit::h3_client::H3Response {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let conf = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[upstream], keys)
        .listener("http3 = true")
        .listener(&tls_table(
            &[&leaf],
            "client_cert_header = \"X-Client-Cert\"\n",
        ));
    let weir = conf.start();
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let mut trailers = http::HeaderMap::new();
    for (name, value) in fields {
        trailers.insert(*name, value.parse().expect("value"));
    }
    let post = Request::post(format!("https://{NAME}{path}"))
        .body(())
        .expect("request");
    let r = request(&mut c.send, post, b"body", Some(trailers)).await;
    r.expect("POST")
}

/// An HTTP/3 client's trailer fields reach an HTTP/2 upstream less the names its request
/// head does not carry as they came: the forwarded headers Weir sets and the listener's
/// client-certificate header (in any spelling), which an upstream that merges trailers
/// into the head would take for Weir's. The others go.
#[tokio::test]
async fn request_trailers_lose_the_names_the_head_does_not_carry() {
    let backend = H2Backend::h2c();
    let fields = [
        ("x-client-trailer", "kept"),
        ("x-sum", "1"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("x-forwarded-host", "evil.test"),
        ("x-client-cert", "forged"),
        ("x_client_cert", "forged"),
    ];
    let h2c = ["protocol = \"h2c\""];
    let r = post_with_trailers(backend.addr(), &h2c, "/trailer-fields", &fields).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"body");
    let trailers = r.trailers.expect("trailers");
    assert_eq!(trailers["x-trailer-fields"], "x-client-trailer,x-sum");
}

/// An HTTP/3 client's trailer fields reach an HTTP/1.1 upstream in the chunked body's
/// trailer section, less the names its request head does not carry as they came (the
/// client-certificate header here) and those no trailer may carry.
#[tokio::test]
async fn request_trailers_reach_an_http1_upstream_in_the_chunked_body() {
    let (arrived, _arrivals) = tokio::sync::mpsc::unbounded_channel();
    let upstream = common::echoing_raw_chunked(arrived);
    let fields = [
        ("x-sum", "1"),
        ("x-client-cert", "forged"),
        ("content-length", "9"),
    ];
    let r = post_with_trailers(upstream, &[], "/up", &fields).await;
    assert_eq!(r.status, 200);
    let got = String::from_utf8_lossy(&r.body);
    assert!(
        got.ends_with("\r\n\r\n4\r\nbody\r\n0\r\nx-sum: 1\r\n\r\n"),
        "{got}"
    );
}

/// A bidirectional gRPC stream over HTTP/3 to an h2c upstream: each message comes back
/// before the next is sent (nothing waits for the request's end), then the status trailer.
#[tokio::test]
async fn grpc_streams_both_ways_to_an_h2c_upstream() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = H2Backend::h2c();
    let weir = to_h2c(&backend, &leaf);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let call = Request::post(format!("https://{NAME}/echo.Echo/Chat"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let mut stream = c.send.send_request(call).await.expect("stream");
    let mut head = None;
    // Each echo must come while the request is still open: a proxy that waited for the
    // request's end would never answer, so the wait is bounded (generous: load).
    let chat = async {
        for word in [&b"one"[..], b"two", b"three"] {
            let message = grpc_frame(word);
            let sent = stream.send_data(Bytes::from(message.clone())).await;
            sent.expect("message sent");
            if head.is_none() {
                head = Some(stream.recv_response().await.expect("head"));
            }
            let mut echoed = Vec::new();
            while echoed.len() < message.len() {
                let mut data = stream.recv_data().await.expect("data").expect("echo");
                echoed.extend_from_slice(&data.copy_to_bytes(data.remaining()));
            }
            assert_eq!(echoed, message);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), chat)
        .await
        .expect("each message echoed before the request's end");
    let head = head.expect("head");
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-type"], "application/grpc");
    stream.finish().await.expect("finished");
    assert!(stream.recv_data().await.expect("end").is_none());
    let trailers = stream.recv_trailers().await.expect("trailers");
    assert_eq!(trailers.expect("trailers")["grpc-status"], "0");
}

/// A gRPC call Weir fails itself gets a gRPC status (trailers-only), as over HTTP/2, and
/// counts as the 502 Weir meant; a plain request gets the 502.
#[tokio::test]
async fn a_grpc_call_to_a_down_h2c_upstream_gets_unavailable() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let dead = dead_port();
    let conf =
        Conf::new()
            .route("all", "up", &[])
            .upstream("up", &[dead.addr], &["protocol = \"h2c\""]);
    let weir = start(conf, &[&leaf], "http3 = true");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let call = Request::post(format!("https://{NAME}/echo.Echo/Say"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let r = request(&mut c.send, call, &grpc_frame(b"x"), None)
        .await
        .expect("call");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("grpc-status"), Some("14"), "UNAVAILABLE");
    assert!(r
        .header("grpc-message")
        .is_some_and(|m| m.contains("connect")));
    assert!(r.body.is_empty() && r.trailers.is_none(), "trailers-only");
    let series = "weir_requests_total{listener=\"web\",route=\"all\",method=\"POST\",code=\"502\",protocol=\"HTTP/3\"}";
    weir.wait_metric(series, 1).await;
    let r = get(&mut c.send, NAME, "/").await.expect("GET");
    assert_eq!(r.status, 502);
}

/// A files route answers HTTP/3 clients as it answers HTTP/1.1 and HTTP/2 ones: the file
/// with its validators, ranges, conditionals, HEAD, a large file under flow control, 404.
#[tokio::test]
async fn a_files_route_serves_ranges_and_conditionals() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let root = std::env::temp_dir().join(format!("weir-h3-files-{}", std::process::id()));
    std::fs::create_dir_all(&root).expect("mkdir");
    std::fs::write(root.join("a.txt"), b"0123456789abcdefghij").expect("write");
    let big = pattern_vec(600_000);
    std::fs::write(root.join("big.bin"), &big).expect("write");
    let files = format!("files = {{ root = \"{}\" }}", root.display());
    let small = "http3 = { stream_window = \"16KiB\", connection_window = \"32KiB\" }";
    let weir = start(Conf::new().route_keys("site", &[&files]), &[&leaf], small);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let with = |path: &str, field: (&str, &str)| {
        Request::get(format!("https://{NAME}{path}"))
            .header(field.0, field.1)
            .body(())
            .expect("request")
    };
    let r = get(&mut c.send, NAME, "/a.txt").await.expect("GET");
    assert_eq!((r.status, r.text().as_str()), (200, "0123456789abcdefghij"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some("20"));
    let etag = r.header("etag").expect("etag").to_owned();
    let range = with("/a.txt", ("range", "bytes=10-"));
    let r = request(&mut c.send, range, &[], None).await.expect("range");
    assert_eq!((r.status, r.text().as_str()), (206, "abcdefghij"));
    assert_eq!(r.header("content-range"), Some("bytes 10-19/20"));
    let unsatisfiable = with("/a.txt", ("range", "bytes=50-"));
    let r = request(&mut c.send, unsatisfiable, &[], None)
        .await
        .expect("416");
    assert_eq!(r.status, 416);
    let conditional = with("/a.txt", ("if-none-match", &etag));
    let r = request(&mut c.send, conditional, &[], None)
        .await
        .expect("304");
    assert_eq!((r.status, r.body.len()), (304, 0));
    let head = Request::head(format!("https://{NAME}/a.txt"))
        .body(())
        .expect("request");
    let r = request(&mut c.send, head, &[], None).await.expect("HEAD");
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("content-length"), Some("20"));
    let r = get(&mut c.send, NAME, "/big.bin").await.expect("large");
    assert!(r.status == 200 && r.body == big, "{} bytes", r.body.len());
    let r = get(&mut c.send, NAME, "/missing").await.expect("404");
    assert_eq!(r.status, 404);
    let _ = std::fs::remove_dir_all(&root);
}

/// QUIC handshakes take handshake places as TLS handshakes over TCP do, under the
/// listener's `max_handshakes`. At the cap an Initial from an address not yet proven gets
/// a Retry instead of a place: silent Initials (spoofed sources, below `retry_threshold`)
/// can fill the places but never evict a handshake in progress. A real client answers the
/// Retry, and its proven Initial takes the idlest place, with its connection permit.
#[tokio::test]
async fn stalled_handshakes_give_way_at_max_handshakes() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let tls = tls_table(
        &[&leaf],
        "max_handshakes = 2\nhandshake_timeout = \"60s\"\n",
    );
    // QUIC's idle timeout is past the test's length: only an eviction ends a handshake.
    let weir = single(backend.addr())
        .listener("http3 = { idle_timeout = \"300s\" }")
        .listener("max_connections = 6")
        .listener(&tls)
        .start();
    let evictions = "weir_http3_handshake_evictions_total{listener=\"web\"}";
    let retries = "weir_http3_retries_total{listener=\"web\"}";
    let mut silent = Vec::new();
    for _ in 0..10 {
        let initial = stalled_initial(weir.addr, NAME, &ca.client_config()).await;
        silent.push(initial.expect("an Initial sent"));
    }
    // Past the two places, newcomers are asked to prove their address (a datagram lost
    // under load only makes one fewer: the count is not asserted exactly).
    let asked = || weir.metric_now(retries).unwrap_or(0) >= 1;
    let asked = weir_testkit::wait_until_async(common::WAIT, asked).await;
    assert!(
        asked,
        "no Retry at max_handshakes:\n{}",
        weir.metrics_text()
    );
    assert_eq!(
        weir.metric(evictions),
        0,
        "an unproven Initial evicts nothing"
    );
    assert_eq!(weir.metric("weir_http3_refused_total{listener=\"web\"}"), 0);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    weir.wait_metric(evictions, 1).await;
}

/// Was: each worker bound its UDP socket after the start had returned and only logged a
/// failure, so Weir ran on without HTTP/3 when the port was taken over UDP (and at every
/// start the port was closed to QUIC for a moment: a client's first Initial could meet an
/// ICMP port unreachable, which clients take as "no HTTP/3 here").
#[test]
fn an_http3_port_taken_over_udp_fails_the_start_naming_udp() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    // A port free over TCP whose UDP side another socket holds (without SO_REUSEPORT).
    let (addr, _taken) = (0..20)
        .find_map(|_| {
            let tcp = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
            let addr = tcp.local_addr().ok()?;
            Some((addr, std::net::UdpSocket::bind(addr).ok()?))
        })
        .expect("a port free over TCP and bound over UDP");
    let toml = single(dead_port().addr)
        .bind(addr)
        .listener("http3 = true")
        .listener(&tls_table(&[&leaf], ""))
        .toml();
    let config = weir_config::parse_str(&toml, "test.toml").expect("config");
    let error = weir_core::Proxy::start(config, 1).err().expect("refused");
    let text = error.to_string();
    assert!(text.contains("UDP (http3)"), "{text}");
    assert!(text.contains(&addr.to_string()), "{text}");
}

/// Was: turning `http3` on by a reload kept the listener's sockets, so its routes
/// advertised HTTP/3 (`Alt-Svc`) on a port with no QUIC endpoint until something else
/// rebound it.
#[tokio::test]
async fn http3_turned_on_and_off_by_a_reload_follows_at_once() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    // A fixed port: the rebind keeps it (port 0 would move).
    let addr = (0..20)
        .find_map(|_| {
            let tcp = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
            let addr = tcp.local_addr().ok()?;
            std::net::UdpSocket::bind(addr).ok().map(|_| addr)
        })
        .expect("a port free over TCP and UDP");
    let conf = |http3: &str| {
        single(backend.addr())
            .bind(addr)
            .listener(http3)
            .listener(&tls_table(&[&leaf], ""))
    };
    let weir = conf("http3 = false").start();
    weir.apply_text(&conf("http3 = true").toml())
        .expect("apply");
    let mut c = connect_to(&ca, addr, NAME).await;
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    weir.apply_text(&conf("http3 = false").toml())
        .expect("apply");
    // Off: once its last connection has closed, the endpoint lets the port go.
    drop(c);
    let released = || std::net::UdpSocket::bind(addr).is_ok();
    let released = weir_testkit::wait_until_async(common::WAIT, released).await;
    assert!(
        released,
        "the UDP port is still held after http3 was turned off"
    );
}

/// Was: toward an HTTP/1.1 upstream, a client whose connection closed while the response
/// head was awaited held the upstream connection until `response_timeout`.
#[tokio::test]
async fn a_client_that_leaves_while_the_head_is_awaited_frees_the_upstream_at_once() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::hang();
    let conf = Conf::new().route("all", "up", &[]).upstream(
        "up",
        &[backend.addr()],
        &["response_timeout = \"300s\""],
    );
    let weir = start(conf, &[&leaf], "http3 = true");
    let c = connect_to(&ca, weir.addr, NAME).await;
    let mut send = c.send.clone();
    let waiting = tokio::spawn(async move { get(&mut send, NAME, "/").await });
    let asked = || backend.in_flight() == 1;
    assert!(weir_testkit::wait_until_async(common::WAIT, asked).await);
    c.connection.close(0u32.into(), b"bye");
    // Well inside the 300 s response timeout: only the close can end it.
    let freed = || backend.in_flight() == 0;
    let freed = weir_testkit::wait_until_async(common::WAIT, freed).await;
    assert!(
        freed,
        "the upstream request outlived its client's connection"
    );
    waiting.abort();
}
