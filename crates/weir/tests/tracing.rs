//! OpenTelemetry traces (`[tracing]`) seen from a real OTLP/HTTP receiver: the server span
//! of a request and the client spans of its upstream attempts (retries as siblings),
//! their attributes, W3C trace context in (from trusted peers only) and out, sampling,
//! the access log's ids, HTTP/3 requests, and a slow or dead collector that costs
//! requests nothing.

mod common;

use std::time::{Duration, Instant};

use common::{dead_port, Conf, JsonLog, Weir, WAIT};
use weir_testkit::h3_client::{connect, get as h3_get};
use weir_testkit::otlp::{int_attr, string_attr, OtlpReceiver, Span};
use weir_testkit::{wait_until, Backend};

const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;
const INCOMING: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// `[tracing]` exporting to `endpoint` every 20 ms, with `extra` lines.
fn tracing_table(endpoint: &str, sampling: f64, extra: &str) -> String {
    format!(
        "[tracing]\nendpoint = \"{endpoint}\"\nsampling = {sampling}\nbatch_delay = \"20ms\"\n\
         service_name = \"edge\"\n{extra}"
    )
}

/// Waits until the receiver has `n` spans (then returns them).
fn spans(receiver: &OtlpReceiver, n: usize) -> Vec<Span> {
    assert!(
        wait_until(WAIT, || receiver.spans().len() >= n),
        "want {n} spans, have {:?}",
        receiver.spans()
    );
    receiver.spans()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn of_kind(spans: &[Span], kind: i32) -> Vec<&Span> {
    spans.iter().filter(|s| s.kind == kind).collect()
}

/// The `traceparent` line of a request head the echo backend sent back.
fn upstream_traceparent(echoed: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(echoed);
    text.lines()
        .find_map(|l| l.strip_prefix("traceparent: ").map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_has_a_server_span_and_sibling_client_spans() {
    let receiver = OtlpReceiver::start();
    let busy = Backend::fixed(503, &[], "busy\n");
    let echo = Backend::echo("echo");
    let log = JsonLog::new("tracing-retry");
    let weir = Conf::new()
        .listener(&log.listener_line())
        .with_request_ids()
        .route("api", "app", &["path_prefix = \"/api/\""])
        .upstream(
            "app",
            &[busy.addr(), echo.addr()],
            &["[upstreams.app.passive]\nmax_fails = 0\n[upstreams.app.retry]\non = [\"503\"]"],
        )
        .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
        .start();
    let mut client = weir.client().await;
    let r = client.get("/api/x?q=1", "shop.test").await.unwrap();
    assert_eq!(r.status, 200);
    let spans = spans(&receiver, 3);
    assert_eq!(spans.len(), 3, "{spans:?}");
    assert_eq!(receiver.service_names()[0], "edge");
    let server = of_kind(&spans, SERVER)[0];
    let clients = of_kind(&spans, CLIENT);
    assert_eq!(clients.len(), 2);
    assert!(server.parent_span_id.is_empty(), "a new trace");
    assert_eq!(server.name, "GET /api/");
    let a = &server.attributes;
    assert_eq!(string_attr(a, "http.request.method"), Some("GET"));
    assert_eq!(string_attr(a, "http.route"), Some("/api/"));
    assert_eq!(string_attr(a, "url.path"), Some("/api/x"));
    assert_eq!(string_attr(a, "server.address"), Some("shop.test"));
    assert_eq!(string_attr(a, "network.protocol.version"), Some("1.1"));
    assert_eq!(int_attr(a, "http.response.status_code"), Some(200));
    assert!(server.status.is_none(), "a 200 is no error");
    for c in &clients {
        assert_eq!(c.trace_id, server.trace_id);
        assert_eq!(
            c.parent_span_id, server.span_id,
            "siblings under the server span"
        );
        assert!(c.start_time_unix_nano >= server.start_time_unix_nano);
        assert!(c.end_time_unix_nano <= server.end_time_unix_nano);
    }
    let first = clients
        .iter()
        .find(|c| int_attr(&c.attributes, "http.response.status_code") == Some(503));
    let first = first.expect("the 503 attempt");
    assert_eq!(
        int_attr(&first.attributes, "http.request.resend_count"),
        None
    );
    assert_eq!(first.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    let port = i64::from(busy.addr().port());
    assert_eq!(int_attr(&first.attributes, "server.port"), Some(port));
    let second = clients.iter().find(|c| c.span_id != first.span_id).unwrap();
    assert_eq!(
        int_attr(&second.attributes, "http.request.resend_count"),
        Some(1)
    );
    assert_eq!(
        int_attr(&second.attributes, "http.response.status_code"),
        Some(200)
    );
    assert_eq!(
        string_attr(&second.attributes, "server.address"),
        Some("127.0.0.1")
    );
    assert!(second.status.is_none());
    // The upstream's traceparent names the trace and the attempt's span.
    let sent = upstream_traceparent(&r.body).expect("a traceparent upstream");
    assert_eq!(
        sent,
        format!("00-{}-{}-01", hex(&server.trace_id), hex(&second.span_id))
    );
    // The access log has both the request id and the trace's ids.
    let line = &log.lines(1)[0];
    assert!(
        line.contains(&format!("\"trace_id\":\"{}\"", hex(&server.trace_id))),
        "{line}"
    );
    assert!(
        line.contains(&format!("\"span_id\":\"{}\"", hex(&server.span_id))),
        "{line}"
    );
    assert!(line.contains("\"request_id\":\""), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_request_is_traced_and_a_failure_marked() {
    let receiver = OtlpReceiver::start();
    let dead = dead_port();
    let weir = Conf::new()
        .route("gone", "down", &["path_prefix = \"/gone/\""])
        .route("all", "up", &[])
        .upstream("down", &[dead.addr], &[])
        .upstream("up", &[Backend::echo("e").addr()], &[])
        .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
        .start();
    let mut h2 = common::h2c_client(weir.addr).await;
    let req = http::Request::get("http://h2.test/gone/x")
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(req, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 502);
    let spans = spans(&receiver, 2);
    let server = of_kind(&spans, SERVER)[0];
    assert_eq!(
        string_attr(&server.attributes, "network.protocol.version"),
        Some("2")
    );
    assert_eq!(
        string_attr(&server.attributes, "server.address"),
        Some("h2.test")
    );
    assert_eq!(
        int_attr(&server.attributes, "http.response.status_code"),
        Some(502)
    );
    assert_eq!(server.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    assert_eq!(
        string_attr(&server.attributes, "error.type"),
        Some("connect error")
    );
    let client = of_kind(&spans, CLIENT)[0];
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(client.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    assert_eq!(
        string_attr(&client.attributes, "error.type"),
        Some("connect error")
    );
}

/// To an HTTP/2 upstream (from an HTTP/1.1 client, and from an h2c client's own fields),
/// the client's trace context is replaced by the attempt's, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upstream_gets_the_attempts_traceparent() {
    let receiver = OtlpReceiver::start();
    let backend = weir_testkit::H2Backend::h2c();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &["protocol = \"h2c\""])
        .listener("trusted_proxies = [\"10.0.0.0/8\"]")
        .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
        .start();
    let mut client = weir.client().await;
    let headers = [("traceparent", INCOMING), ("tracestate", "a=b")];
    let r = client
        .request("GET", "/show-fields", &headers, b"")
        .await
        .unwrap();
    let h1_fields = String::from_utf8_lossy(&r.body).into_owned();
    let mut h2 = common::h2c_client(weir.addr).await;
    let req = http::Request::get("http://t/show-fields")
        .header("traceparent", INCOMING)
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(req, true).unwrap();
    let mut body = response.await.unwrap().into_body();
    let mut h2_fields = Vec::new();
    while let Some(chunk) = body.data().await {
        h2_fields.extend_from_slice(&chunk.unwrap());
    }
    let h2_fields = String::from_utf8_lossy(&h2_fields).into_owned();
    let spans = spans(&receiver, 4);
    for (fields, version) in [(h1_fields, "1.1"), (h2_fields, "2")] {
        let server = spans
            .iter()
            .find(|s| {
                s.kind == SERVER
                    && string_attr(&s.attributes, "network.protocol.version") == Some(version)
            })
            .expect("the server span");
        let attempt = spans
            .iter()
            .find(|s| s.parent_span_id == server.span_id)
            .unwrap();
        assert_eq!(
            string_attr(&attempt.attributes, "network.protocol.version"),
            Some("2")
        );
        let want = format!(
            "traceparent: 00-{}-{}-01",
            hex(&server.trace_id),
            hex(&attempt.span_id)
        );
        assert_eq!(fields.matches("traceparent").count(), 1, "{fields}");
        assert!(fields.contains(&want), "{version}: {fields}");
        assert!(!fields.contains("tracestate"), "untrusted: {fields}");
    }
}

/// A trusted peer's `traceparent` continues its trace; an untrusted peer's is ignored, and
/// without `trusted_proxies` every peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incoming_traceparent_is_honoured_only_from_trusted_proxies() {
    let cases = [
        ("trusted_proxies = [\"127.0.0.1/32\"]", true),
        ("trusted_proxies = [\"10.0.0.0/8\"]", false),
        // No trusted_proxies: no peer is trusted with the trace context.
        ("", false),
    ];
    for (trusted, honoured) in cases {
        let receiver = OtlpReceiver::start();
        let echo = Backend::echo("echo");
        let weir = common::single(echo.addr())
            .listener(trusted)
            .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
            .start();
        let mut client = weir.client().await;
        let headers = [("traceparent", INCOMING), ("tracestate", "vendor=abc")];
        let r = client.request("GET", "/", &headers, b"").await.unwrap();
        let spans = spans(&receiver, 2);
        let server = of_kind(&spans, SERVER)[0];
        let client_span = of_kind(&spans, CLIENT)[0];
        let sent = upstream_traceparent(&r.body).expect("a traceparent upstream");
        let echoed = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(echoed.matches("traceparent:").count(), 1, "{echoed}");
        assert_eq!(
            sent,
            format!(
                "00-{}-{}-01",
                hex(&server.trace_id),
                hex(&client_span.span_id)
            )
        );
        if honoured {
            assert_eq!(hex(&server.trace_id), "0af7651916cd43dd8448eb211c80319c");
            assert_eq!(hex(&server.parent_span_id), "b7ad6b7169203331");
            assert!(echoed.contains("tracestate: vendor=abc"), "{echoed}");
        } else {
            assert_ne!(hex(&server.trace_id), "0af7651916cd43dd8448eb211c80319c");
            assert!(server.parent_span_id.is_empty());
            assert!(!echoed.contains("tracestate"), "{echoed}");
        }
    }
}

/// Sampling 0 exports nothing and leaves the request as it came; a route's `tracing =
/// { sampling = 1.0 }` traces all of its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_zero_exports_nothing_and_a_route_can_override_it() {
    let receiver = OtlpReceiver::start();
    let echo = Backend::echo("echo");
    let weir = Conf::new()
        .route(
            "traced",
            "up",
            &["path_prefix = \"/traced/\"", "tracing = { sampling = 1.0 }"],
        )
        .route("all", "up", &[])
        .upstream("up", &[echo.addr()], &[])
        .table(&tracing_table(&receiver.endpoint(), 0.0, ""))
        .start();
    let mut client = weir.client().await;
    for _ in 0..20 {
        let r = client.get("/plain", "t").await.unwrap();
        assert_eq!(upstream_traceparent(&r.body), None);
    }
    // A parent that is not sampled is followed (parent-based), and its trace context
    // goes on as it came.
    let unsampled = INCOMING.replace("-01", "-00");
    let headers = [("traceparent", unsampled.as_str())];
    let r = client
        .request("GET", "/plain", &headers, b"")
        .await
        .unwrap();
    assert_eq!(upstream_traceparent(&r.body), Some(unsampled));
    // One worker, one queue: once this request's spans arrived, the others' would have.
    client.get("/traced/x", "t").await.unwrap();
    let spans = spans(&receiver, 2);
    assert_eq!(spans.len(), 2, "only the traced route's request: {spans:?}");
    let server = of_kind(&spans, SERVER)[0];
    assert_eq!(
        string_attr(&server.attributes, "http.route"),
        Some("/traced/")
    );
}

/// The collector's headers go with each export; a reload changes the sampling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_the_tracing_table() {
    let receiver = OtlpReceiver::start();
    let echo = Backend::echo("echo");
    let conf = |sampling| {
        common::single(echo.addr()).table(&tracing_table(
            &receiver.endpoint(),
            sampling,
            "headers = { Authorization = \"Bearer t0k\" }\n",
        ))
    };
    let weir = conf(0.0).start();
    let mut client = weir.client().await;
    client.get("/one", "t").await.unwrap();
    weir.apply_text(&conf(1.0).toml()).expect("reload");
    let mut client = weir.client().await;
    client.get("/two", "t").await.unwrap();
    let spans = spans(&receiver, 2);
    let server = of_kind(&spans, SERVER)[0];
    assert_eq!(string_attr(&server.attributes, "url.path"), Some("/two"));
    let headers = &receiver.request_headers()[0];
    assert!(
        headers.contains(&("authorization".into(), "Bearer t0k".into())),
        "{headers:?}"
    );
    assert!(headers.contains(&("content-type".into(), "application/x-protobuf".into())));
}

fn dropped(weir: &Weir, reason: &str) -> u64 {
    weir.metric_now(&format!(
        "weir_tracing_spans_dropped_total{{reason=\"{reason}\"}}"
    ))
    .unwrap_or(0)
}

/// A collector that is down, or that hangs, costs requests nothing: spans are dropped
/// and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_hanging_collector_does_not_slow_requests() {
    let dead = dead_port();
    let echo = Backend::echo("echo");
    let weir = common::single(echo.addr())
        .table(&tracing_table(
            &format!("http://{}/v1/traces", dead.addr),
            1.0,
            "",
        ))
        .start();
    let before = dropped(&weir, "export_failed");
    let mut client = weir.client().await;
    for _ in 0..10 {
        assert_eq!(client.get("/", "t").await.unwrap().status, 200);
    }
    assert!(wait_until(WAIT, || dropped(&weir, "export_failed") >= before + 20));

    let receiver = OtlpReceiver::start();
    receiver.stall(true);
    // The hung export outlasts the requests below; Weir's exit (at the end of the test)
    // waits for the stalled collector up to this timeout.
    let extra = "queue_size = 4\nbatch_size = 1\ntimeout = \"10s\"\n";
    let weir = common::single(echo.addr())
        .table(&tracing_table(&receiver.endpoint(), 1.0, extra))
        .start();
    let before = dropped(&weir, "queue_full");
    let mut client = weir.client().await;
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(client.get("/", "t").await.unwrap().status, 200);
    }
    // Only a hang would take this long (50 requests on loopback take milliseconds; the
    // stalled collector holds its export for 10 s).
    assert!(started.elapsed() < Duration::from_secs(20));
    // 100 spans, at most 4 queued and one batch in the hung export.
    assert!(
        dropped(&weir, "queue_full") >= before + 90,
        "{}",
        weir.metrics_text()
    );
}

/// Spans still queued when Weir stops (here: a batch delay of an hour) are sent before
/// it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_spans_are_sent_at_shutdown() {
    let receiver = OtlpReceiver::start();
    let echo = Backend::echo("echo");
    let table = format!(
        "[tracing]\nendpoint = \"{}\"\nsampling = 1.0\nbatch_delay = \"1h\"\n",
        receiver.endpoint()
    );
    let weir = common::single(echo.addr()).table(&table).start();
    let mut client = weir.client().await;
    assert_eq!(client.get("/", "t").await.unwrap().status, 200);
    drop(client);
    assert!(receiver.spans().is_empty(), "sent before the batch delay");
    tokio::task::block_in_place(|| weir.proxy().shutdown());
    // `shutdown` returned after the flush: nothing to wait for.
    assert_eq!(receiver.spans().len(), 2, "the server and the client span");
}

/// An `https://` collector: its certificate checked against `ca_file` (spans arrive), or
/// against the system's roots, which do not know the test CA (the exports fail, counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_collector_is_verified_against_ca_file() {
    let ca = weir_testkit::certs::TestCa::new("collector CA");
    let tls = weir_testkit::TlsServer::new(&ca.leaf(&["localhost"]));
    let receiver = OtlpReceiver::start_tls(&tls);
    let echo = Backend::echo("echo");
    let trusting = format!("ca_file = {:?}\n", ca.cert_path.display().to_string());
    let weir = common::single(echo.addr())
        .table(&tracing_table(&receiver.endpoint(), 1.0, &trusting))
        .start();
    let mut client = weir.client().await;
    assert_eq!(client.get("/secure", "t").await.unwrap().status, 200);
    let spans = spans(&receiver, 2);
    let server = of_kind(&spans, SERVER)[0];
    assert_eq!(string_attr(&server.attributes, "url.path"), Some("/secure"));

    let weir = common::single(echo.addr())
        .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
        .start();
    let before = dropped(&weir, "export_failed");
    let mut client = weir.client().await;
    assert_eq!(client.get("/untrusted", "t").await.unwrap().status, 200);
    assert!(wait_until(WAIT, || dropped(&weir, "export_failed") >= before + 2));
    assert_eq!(
        receiver.spans().len(),
        2,
        "nothing over an unverified connection"
    );
}

#[test]
fn tracing_keys_are_checked_with_a_fix() {
    let bad = [
        (
            "[tracing]\nendpoint = \"http://c:4318/v1/traces\"\nsampling = 1.5\n",
            "tracing.sampling",
        ),
        (
            "[tracing]\nendpoint = \"ftp://c/v1/traces\"\n",
            "tracing.endpoint",
        ),
        (
            "[tracing]\nendpoint = \"http://c/v1/traces\"\nca_file = \"/etc/ca.pem\"\n",
            "tracing.ca_file",
        ),
        ("[tracing]\nsampling = 0.1\n", "tracing.endpoint"),
        (
            "[tracing]\nendpoint = \"http://c\"\nbatch_size = 9000\nqueue_size = 10\n",
            "tracing.batch_size",
        ),
        (
            "[tracing]\nendpoint = \"http://c\"\nheaders = { Host = \"x\" }\n",
            "tracing.headers.Host",
        ),
    ];
    for (table, field) in bad {
        let base = Conf::new().route("all", "up", &[]);
        let up = base.upstream("up", &["127.0.0.1:1".parse().unwrap()], &[]);
        let toml = format!("{}\n{table}", up.toml());
        let e = weir_config::parse_str(&toml, "t.toml")
            .expect_err(table)
            .to_string();
        assert!(e.contains(field), "{field}: {e}");
        assert!(e.contains("t.toml:"), "{e}");
    }
}

/// An HTTP/3 request is traced as HTTP/1.1 and HTTP/2 ones are: a server span (protocol
/// version 3) with a client span per attempt, whose trace context reaches the upstream,
/// over HTTP/1.1 and over HTTP/2 (from the client's own fields) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_request_is_traced_to_both_upstream_protocols() {
    let receiver = OtlpReceiver::start();
    let ca = weir_testkit::certs::TestCa::new("otel h3 CA");
    let leaf = ca.leaf(&["h3.test"]);
    let h2 = weir_testkit::H2Backend::h2c();
    let echo = Backend::echo("e");
    let weir = Conf::new()
        .route("h2", "h2", &["path_prefix = \"/show-fields\""])
        .route("all", "up", &[])
        .upstream("h2", &[h2.addr()], &["protocol = \"h2c\""])
        .upstream("up", &[echo.addr()], &[])
        .table(&tracing_table(&receiver.endpoint(), 1.0, ""))
        .listener("http3 = true")
        .listener(&common::tls_table(&[&leaf], ""))
        .start();
    let mut c = connect(weir.addr, "h3.test", &ca.client_config())
        .await
        .expect("HTTP/3 connection");
    let h1 = h3_get(&mut c.send, "h3.test", "/x").await.expect("GET");
    assert_eq!(h1.status, 200);
    let h2_fields = h3_get(&mut c.send, "h3.test", "/show-fields").await;
    let h2_fields = h2_fields.expect("GET").text();
    let spans = spans(&receiver, 4);
    let servers = of_kind(&spans, SERVER);
    assert_eq!(servers.len(), 2, "{spans:?}");
    for (server, fields, upstream) in [(servers[0], h1.text(), "1.1"), (servers[1], h2_fields, "2")]
    {
        assert_eq!(
            string_attr(&server.attributes, "network.protocol.version"),
            Some("3")
        );
        assert_eq!(
            string_attr(&server.attributes, "server.address"),
            Some("h3.test")
        );
        assert_eq!(
            int_attr(&server.attributes, "http.response.status_code"),
            Some(200)
        );
        let attempt = spans
            .iter()
            .find(|s| s.kind == CLIENT && s.parent_span_id == server.span_id)
            .expect("the attempt's span");
        assert_eq!(
            string_attr(&attempt.attributes, "network.protocol.version"),
            Some(upstream)
        );
        let want = format!(
            "traceparent: 00-{}-{}-01",
            hex(&server.trace_id),
            hex(&attempt.span_id)
        );
        assert!(
            fields.to_ascii_lowercase().contains(&want),
            "{upstream}: {fields}"
        );
    }
}
