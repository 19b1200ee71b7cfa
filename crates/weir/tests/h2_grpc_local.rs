//! gRPC requests Weir answers itself, over h2c with a real h2 client: no route (404), access
//! lists (403), rate limit (429), basic auth (401), body too large (413), a route's
//! `respond` and `redirect` each reach the client as a trailers-only gRPC status (HTTP 200,
//! `content-type: application/grpc`, `grpc-status`, percent-encoded `grpc-message`), while
//! metrics and the access log count the HTTP status Weir meant and plain HTTP/2 requests
//! keep plain answers.

mod common;

use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderMap, Method, Request, StatusCode};

use common::{h2c_client, Conf, Weir, WAIT};
use weir_testkit::{wait_until_async, Backend};

/// The request body every call sends: one gRPC message of 5 payload bytes.
const MESSAGE: &[u8] = b"\x00\x00\x00\x00\x05hello";

/// A whole answer: status, fields, body, trailers.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn field(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers))
    }

    /// A trailers-only gRPC answer with `code` and the (encoded) `message`.
    fn assert_grpc(&self, code: &str, message: &str) {
        assert_eq!(self.status, StatusCode::OK, "{:?}", self.headers);
        assert_eq!(self.field("content-type"), "application/grpc");
        assert_eq!(self.field("grpc-status"), code);
        assert_eq!(self.field("grpc-message"), message);
        assert!(self.body.is_empty(), "no DATA: {:?}", self.body);
        assert!(self.trailers.is_none(), "status in the head, no trailers");
    }
}

/// POSTs `body` to `path` (with `content-type: application/grpc` when `grpc`) and reads
/// the whole answer.
async fn call(client: &SendRequest<Bytes>, path: &str, grpc: bool, body: &[u8]) -> Answer {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://example.test{path}"))
        .header("content-length", body.len());
    if grpc {
        request = request
            .header("content-type", "application/grpc")
            .header("te", "trailers");
    }
    let mut client = client.clone().ready().await.expect("ready");
    let (response, mut send) = client
        .send_request(request.body(()).expect("request"), false)
        .expect("send request");
    // Weir may answer before reading the body and reset the rest: that is fine.
    let _ = send.send_data(Bytes::copy_from_slice(body), true);
    let (head, mut recv) = response.await.expect("response").into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = recv.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.expect("trailers");
    Answer {
        status: head.status,
        headers: head.headers,
        body: out,
        trailers,
    }
}

/// A route with `path_prefix = prefix` and the extra `keys`.
fn with_prefix(conf: Conf, name: &str, prefix: &str, keys: &[&str]) -> Conf {
    let prefix = format!("path_prefix = \"{prefix}\"");
    let mut all = vec![prefix.as_str()];
    all.extend_from_slice(keys);
    conf.route_keys(name, &all)
}

/// Waits until `want` POSTs on `route` were counted with `code` (a stream is counted after
/// its answer was sent, so the client may have it first).
async fn counted(weir: &Weir, route: &str, code: u16, want: u64) {
    let series = format!(
        "weir_requests_total{{listener=\"web\",route=\"{route}\",method=\"POST\",code=\"{code}\",protocol=\"HTTP/2.0\"}}"
    );
    weir.wait_metric(&series, want).await;
}

/// A bcrypt htpasswd file (removed on drop).
struct Users(std::path::PathBuf);

impl Users {
    fn new() -> Users {
        let path = std::env::temp_dir().join(format!("weir-grpc-users-{}", std::process::id()));
        let hash = bcrypt::hash_with_salt("secret", 4, [3u8; 16]).expect("hash");
        let line = format!("alice:{}\n", hash.format_for_version(bcrypt::Version::TwoY));
        std::fs::write(&path, line).expect("write users");
        Users(path)
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn policy_weir(backend: &Backend, users: &Users) -> Weir {
    let auth = format!("basic_auth = {{ users_file = \"{}\" }}", users.0.display());
    let conf = Conf::new().upstream("up", &[backend.addr()], &[]);
    let conf = with_prefix(
        conf,
        "denied",
        "/denied/",
        &["upstream = \"up\"", "deny = [\"127.0.0.0/8\"]"],
    );
    let limit = "rate_limit = { rate = \"1/h\", burst = 1, key = \"client_ip\" }";
    let conf = with_prefix(conf, "limited", "/limited/", &["upstream = \"up\"", limit]);
    with_prefix(conf, "auth", "/auth/", &["upstream = \"up\"", &auth]).start()
}

#[tokio::test]
async fn grpc_requests_weir_refuses_get_a_grpc_status_and_count_the_http_one() {
    let backend = Backend::fixed(200, &[], "ok");
    let users = Users::new();
    let weir = policy_weir(&backend, &users);
    let client = h2c_client(weir.addr).await;

    call(&client, "/nowhere", true, MESSAGE)
        .await
        .assert_grpc("12", "Not Found");
    call(&client, "/denied/x", true, MESSAGE)
        .await
        .assert_grpc("7", "Forbidden");
    let auth = call(&client, "/auth/x", true, MESSAGE).await;
    auth.assert_grpc("16", "Unauthorized");
    assert!(auth.field("www-authenticate").starts_with("Basic realm="));
    let first = call(&client, "/limited/x", true, MESSAGE).await;
    assert_eq!(
        (first.status, &first.body[..]),
        (StatusCode::OK, &b"ok"[..])
    );
    let limited = call(&client, "/limited/x", true, MESSAGE).await;
    limited.assert_grpc("8", "Too Many Requests");
    assert!(limited.field("retry-after").parse::<u64>().is_ok());
    assert_eq!(backend.requests_served(), 1, "only the first limited call");

    // Metrics count what Weir meant, not the 200 on the wire.
    counted(&weir, "default", 404, 1).await;
    counted(&weir, "denied", 403, 1).await;
    counted(&weir, "auth", 401, 1).await;
    counted(&weir, "limited", 429, 1).await;
    counted(&weir, "limited", 200, 1).await;

    // A plain HTTP/2 request keeps its plain answer.
    let plain = call(&client, "/denied/x", false, b"x").await;
    assert_eq!(plain.status, StatusCode::FORBIDDEN);
    assert!(plain.headers.get("grpc-status").is_none());
    assert_eq!(call(&client, "/nowhere", false, b"x").await.status, 404);
}

#[tokio::test]
async fn a_grpc_request_over_max_body_size_gets_resource_exhausted_and_logs_413() {
    let dir = std::env::temp_dir().join(format!("weir-grpc-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = dir.join("access.log");
    let backend = Backend::fixed(200, &[], "ok");
    let weir = Conf::new()
        .listener("max_body_size = \"8\"")
        .listener(&format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            log.display()
        ))
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let client = h2c_client(weir.addr).await;
    let answer = call(&client, "/svc/Call", true, MESSAGE).await;
    answer.assert_grpc("8", "request body too large");
    // Refused before routing: counted with the requests no route took.
    counted(&weir, "default", 413, 1).await;
    assert_eq!(backend.requests_served(), 0);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let logged = wait_until_async(WAIT, || read().ends_with('\n')).await;
    let line = read();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(logged, "no log line");
    assert!(line.contains("\"status\":413"), "{line}");
}

#[tokio::test]
async fn respond_and_redirect_rules_translate_unless_their_status_is_2xx() {
    let busy = r#"respond = { status = 503, body = "back 100% soon ✓\n", headers = { "Retry-After" = "120" } }"#;
    let conf = with_prefix(Conf::new(), "busy", "/busy/", &[busy]);
    let ok =
        r#"respond = { status = 200, body = "pong", headers = { "Content-Type" = "text/plain" } }"#;
    let conf = with_prefix(conf, "ok", "/ok/", &[ok]);
    let moved = r#"redirect = { to = "/new/" }"#;
    let weir = with_prefix(conf, "moved", "/moved/", &[moved]).start();
    let client = h2c_client(weir.addr).await;

    let busy = call(&client, "/busy/x", true, MESSAGE).await;
    busy.assert_grpc("14", "back 100%25 soon %E2%9C%93");
    assert_eq!(busy.field("retry-after"), "120");
    assert!(busy.headers.get("content-length").is_none());
    let moved = call(&client, "/moved/x", true, MESSAGE).await;
    moved.assert_grpc("2", "Found");
    assert_eq!(moved.field("location"), "/new/");
    // A 2xx the user wrote goes as written.
    let ok = call(&client, "/ok/x", true, MESSAGE).await;
    assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, &b"pong"[..]));
    assert_eq!(ok.field("content-type"), "text/plain");
    assert!(ok.headers.get("grpc-status").is_none());

    counted(&weir, "busy", 503, 1).await;
    counted(&weir, "moved", 302, 1).await;
}

/// Only the answers Weir makes itself are translated: an upstream's own error answer to a
/// gRPC request reaches the client as the upstream sent it, and a gRPC-Web request (whose
/// clients take HTTP statuses) keeps Weir's plain answer.
#[tokio::test]
async fn an_upstreams_own_answer_and_grpc_web_requests_are_not_translated() {
    let backend = Backend::fixed(503, &[("content-type", "application/grpc")], "down");
    let conf = Conf::new().upstream("up", &[backend.addr()], &[]);
    let weir = with_prefix(conf, "svc", "/svc/", &["upstream = \"up\""]).start();
    let client = h2c_client(weir.addr).await;

    let answer = call(&client, "/svc/Call", true, MESSAGE).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        answer.headers.get("grpc-status").is_none(),
        "{:?}",
        answer.headers
    );
    assert_eq!(answer.body, b"down");
    assert_eq!(backend.requests_served(), 1);

    let mut client = client.clone().ready().await.expect("ready");
    let request = Request::builder()
        .method(Method::POST)
        .uri("http://example.test/nowhere")
        .header("content-type", "application/grpc-web+proto")
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    let head = response.await.expect("response");
    assert_eq!(head.status(), StatusCode::NOT_FOUND);
    assert!(head.headers().get("grpc-status").is_none());
}
