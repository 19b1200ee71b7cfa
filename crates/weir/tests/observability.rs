//! Metrics and access logs seen from outside: requests sent over real sockets must show up
//! in the Prometheus text exactly (counts and bytes), per route and per upstream server,
//! and in the access log with the fields the docs promise.

mod common;

use std::net::SocketAddr;

use common::{dead_port, single, Conf, Weir, WAIT};
use weir_testkit::{send_raw_once, wait_until, Backend};

/// The value of the series `name{labels}` (labels exactly as rendered), if present.
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls until the series has `want` (recording happens just after the last byte is sent).
fn wait_for_series(weir: &Weir, name_and_labels: &str, want: f64) {
    let ok = wait_until(WAIT, || {
        series(&weir.metrics_text(), name_and_labels) == Some(want)
    });
    let text = weir.metrics_text();
    assert!(
        ok,
        "{name_and_labels}: want {want}, have {:?}\n{text}",
        series(&text, name_and_labels)
    );
}

fn server_labels(upstream: &str, server: SocketAddr) -> String {
    format!("upstream=\"{upstream}\",server=\"{server}\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_bytes_are_counted_exactly() {
    let backend = Backend::fixed(200, &[], "hello");
    let weir = single(backend.addr())
        .route("only", "up", &["path_prefix = \"/only/\""])
        .start();
    let (mut sent, mut received) = (0usize, 0usize);
    for i in 0..7 {
        let req = format!("GET /x{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let resp = send_raw_once(weir.addr, req.as_bytes()).await.unwrap();
        assert!(resp.starts_with(b"HTTP/1.1 200"));
        sent += req.len();
        received += resp.len();
    }
    for _ in 0..3 {
        let req = b"POST /only/y HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
        let resp = send_raw_once(weir.addr, req).await.unwrap();
        sent += req.len();
        received += resp.len();
    }
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"all\",method=\"GET\",code=\"200\",protocol=\"HTTP/1.1\"}",
        7.0,
    );
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"only\",method=\"POST\",code=\"200\",protocol=\"HTTP/1.1\"}",
        3.0,
    );
    wait_for_series(
        &weir,
        "weir_bytes_total{listener=\"web\",direction=\"in\"}",
        sent as f64,
    );
    wait_for_series(
        &weir,
        "weir_bytes_total{listener=\"web\",direction=\"out\"}",
        received as f64,
    );
    wait_for_series(&weir, "weir_connections_total{listener=\"web\"}", 10.0);
    // Observed apart from the request counter: polled as well.
    wait_for_series(
        &weir,
        "weir_request_duration_seconds_count{listener=\"web\",route=\"all\",protocol=\"HTTP/1.1\"}",
        7.0,
    );
    let text = weir.metrics_text();
    // No HTTP/2 request came: no HTTP/2.0 row of any per-request series.
    assert!(!text.contains("protocol=\"HTTP/2.0\""), "{text}");
    let labels = server_labels("up", backend.addr());
    assert_eq!(
        series(
            &text,
            &format!("weir_upstream_requests_total{{{labels},code=\"200\"}}")
        ),
        Some(10.0)
    );
    assert_eq!(
        series(
            &text,
            &format!("weir_upstream_response_duration_seconds_count{{{labels}}}")
        ),
        Some(10.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_responses_are_counted_by_reason() {
    let backend = Backend::echo("b");
    let weir = Conf::new()
        .route("api", "up", &["path_prefix = \"/api/\""])
        .upstream("up", &[backend.addr()], &[])
        .listener("max_body_size = \"4\"")
        .start();
    let mut client = weir.client().await;
    for _ in 0..4 {
        assert_eq!(client.get("/nothing", "a").await.unwrap().status, 404);
    }
    let resp = send_raw_once(weir.addr, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        .await
        .unwrap();
    assert!(resp.starts_with(b"HTTP/1.1 400"));
    let resp = send_raw_once(
        weir.addr,
        b"POST /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    assert!(resp.starts_with(b"HTTP/1.1 413"));
    let reason =
        |r: &str| format!("weir_default_responses_total{{listener=\"web\",reason=\"{r}\"}}");
    wait_for_series(&weir, &reason("no_route"), 4.0);
    wait_for_series(&weir, &reason("bad_request"), 1.0);
    wait_for_series(&weir, &reason("too_large"), 1.0);
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"default\",method=\"GET\",code=\"404\",protocol=\"HTTP/1.1\"}",
        4.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_servers_have_their_own_series() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let dead = dead_port();
    let weir = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[a.addr(), b.addr()], &[])
        .route("broken", "down", &["path_prefix = \"/broken/\""])
        .upstream("down", &[dead.addr], &[])
        .start();
    let mut client = weir.client().await;
    for _ in 0..6 {
        assert_eq!(client.get("/", "h").await.unwrap().status, 200);
    }
    assert_eq!(client.get("/broken/", "h").await.unwrap().status, 502);
    for server in [a.addr(), b.addr()] {
        let labels = server_labels("up", server);
        wait_for_series(
            &weir,
            &format!("weir_upstream_requests_total{{{labels},code=\"200\"}}"),
            3.0,
        );
        let text = weir.metrics_text();
        // One connection per server, then reused: one connect each, one idle each.
        assert_eq!(
            series(
                &text,
                &format!("weir_upstream_connect_duration_seconds_count{{{labels}}}")
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            series(&text, &format!("weir_upstream_pool_idle{{{labels}}}")),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            series(&text, &format!("weir_upstream_server_up{{{labels}}}")),
            Some(1.0)
        );
    }
    wait_for_series(
        &weir,
        &format!(
            "weir_upstream_requests_total{{{},code=\"502\"}}",
            server_labels("down", dead.addr)
        ),
        1.0,
    );
}

/// `weir_upstream_in_flight` counts a request from the server's pick to the end of its
/// response: 1 while a slow server holds it, 0 after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_per_server() {
    let slow = Backend::slow(std::time::Duration::from_secs(2));
    let weir = single(slow.addr()).start();
    let gauge = format!(
        "weir_upstream_in_flight{{{}}}",
        server_labels("up", slow.addr())
    );
    assert_eq!(series(&weir.metrics_text(), &gauge), Some(0.0));
    let addr = weir.addr;
    let request = tokio::spawn(async move {
        send_raw_once(
            addr,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
    });
    assert!(
        wait_until(WAIT, || slow.in_flight() == 1),
        "the request reached the server"
    );
    // The server holds it for 2 s: the gauge shows it meanwhile (unless this machine is so
    // loaded that the response came first, which the assertion below would say).
    let seen = series(&weir.metrics_text(), &gauge);
    let response = request.await.unwrap().unwrap();
    assert!(response.starts_with(b"HTTP/1.1 200"));
    assert_eq!(seen, Some(1.0), "in flight while the server held it");
    wait_for_series(&weir, &gauge, 0.0);
}

/// A json access log in a fresh temporary directory `weir-<tag>-<pid>`.
struct JsonLog {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl JsonLog {
    fn new(tag: &str) -> JsonLog {
        let dir = std::env::temp_dir().join(format!("weir-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let _ = std::fs::remove_file(&path);
        JsonLog { dir, path }
    }

    /// The listener line that writes this log.
    fn listener_line(&self) -> String {
        format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            self.path.display()
        )
    }

    /// The log's content once it holds a complete line.
    fn first_line(&self) -> String {
        let read = || std::fs::read_to_string(&self.path).unwrap_or_default();
        assert!(
            wait_until(WAIT, || read().ends_with('\n')),
            "no access-log line in {}",
            self.path.display()
        );
        read()
    }
}

impl Drop for JsonLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_log_has_every_field() {
    let log = JsonLog::new("log");
    let backend = Backend::fixed(201, &[], "made");
    let weir = single(backend.addr())
        .listener(&log.listener_line())
        .start();
    let req = b"PUT /thing?q=\"x\" HTTP/1.1\r\nHost: a\r\nUser-Agent: t/1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    let resp = send_raw_once(weir.addr, req).await.unwrap();
    assert!(resp.starts_with(b"HTTP/1.1 201"));
    let line = log.first_line();
    let expect = [
        "\"client\":\"127.0.0.1\"".to_string(),
        "\"method\":\"PUT\"".to_string(),
        "\"target\":\"/thing?q=\\\"x\\\"\"".to_string(),
        "\"protocol\":\"HTTP/1.1\"".to_string(),
        "\"status\":201".to_string(),
        format!("\"bytes_in\":{}", req.len()),
        format!("\"bytes_out\":{}", resp.len()),
        "\"route\":\"all\"".to_string(),
        format!("\"upstream\":\"{}\"", backend.addr()),
        "\"user_agent\":\"t/1\"".to_string(),
    ];
    for field in expect {
        assert!(line.contains(&field), "{field} missing in {line}");
    }
    for key in ["\"time\":\"", "\"duration\":", "\"upstream_time\":"] {
        assert!(line.contains(key), "{key} missing in {line}");
    }
    drop(weir);
}

/// Issue 17: a response that fails after its head was sent counts with the status the
/// client got (the upstream's 200), in the request counter, the per-server counter and the
/// access log alike, plus the abort and its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_short_counts_with_the_status_sent_and_its_abort() {
    let log = JsonLog::new("abort");
    // A 200 head with Content-Length 1000, 100 body bytes, then a close.
    let backend = Backend::close_mid_body();
    let weir = single(backend.addr())
        .listener(&log.listener_line())
        .start();
    let resp = send_raw_once(weir.addr, b"GET /cut HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(
        resp.starts_with(b"HTTP/1.1 200"),
        "the client got the 200 head"
    );
    let requests = |code: &str| {
        format!(
            "weir_requests_total{{listener=\"web\",route=\"all\",method=\"GET\",code=\"{code}\",protocol=\"HTTP/1.1\"}}"
        )
    };
    wait_for_series(&weir, &requests("200"), 1.0);
    let aborted =
        "weir_responses_aborted_total{listener=\"web\",route=\"all\",reason=\"upstream_closed\",protocol=\"HTTP/1.1\"}";
    wait_for_series(&weir, aborted, 1.0);
    let text = weir.metrics_text();
    assert_eq!(series(&text, &requests("502")), None, "{text}");
    let server = format!(
        "weir_upstream_requests_total{{{},code=\"200\"}}",
        server_labels("up", backend.addr())
    );
    assert_eq!(series(&text, &server), Some(1.0), "{text}");
    let line = log.first_line();
    assert!(
        line.contains("\"status\":200,\"aborted\":\"upstream_closed\","),
        "{line}"
    );
    drop(weir);
}

/// A response refused before any byte of it reaches the client (a malformed chunked body
/// already in the first read, a 101 to a protocol never offered) counts as the 502 the
/// client got: in the request counter and in the server's own series, which must not say
/// 200 or 101.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_refused_before_its_head_counts_as_502_for_the_server_too() {
    let refused: [(&[u8], &str); 2] = [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            "200",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            "101",
        ),
    ];
    for (raw, upstream_status) in refused {
        let backend = Backend::raw_response(raw);
        let weir = single(backend.addr()).start();
        // `Connection: close`: the request was read whole, so a 502 would keep it open.
        let req = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        let resp = send_raw_once(weir.addr, req).await.unwrap();
        assert!(
            resp.starts_with(b"HTTP/1.1 502"),
            "{}",
            String::from_utf8_lossy(&resp)
        );
        wait_for_series(
            &weir,
            "weir_requests_total{listener=\"web\",route=\"all\",method=\"GET\",code=\"502\",protocol=\"HTTP/1.1\"}",
            1.0,
        );
        let server = |code: &str| {
            let labels = server_labels("up", backend.addr());
            format!("weir_upstream_requests_total{{{labels},code=\"{code}\"}}")
        };
        wait_for_series(&weir, &server("502"), 1.0);
        let text = weir.metrics_text();
        assert_eq!(series(&text, &server(upstream_status)), None, "{text}");
    }
}
