//! Issue 16's per-route traffic-policy filters over real sockets: header rules (both
//! directions, with variables), request ids, access lists with trusted proxies, rate limits
//! and basic auth. Weir's own answers (403, 429, 401) keep the connection like any other.

mod common;

use common::{forwarded, Conf};
use weir_testkit::Backend;

/// A route `api` on `/` with `keys`, to one upstream `up` on `backend`.
fn route_with(backend: std::net::SocketAddr, keys: &[&str]) -> Conf {
    Conf::new()
        .route("api", "up", keys)
        .upstream("up", &[backend], &[])
}

#[tokio::test]
async fn request_header_rules_set_add_remove_with_variables() {
    let b = Backend::echo("up");
    let weir = route_with(
        b.addr(),
        &[r#"request_headers = { set = { "X-Env" = "prod", "X-Origin" = "{scheme}://{host}{uri} q={query}" }, add = { "X-Multi" = "two" }, remove = ["X-Debug"] }"#],
    )
    .start();
    let mut c = weir.client().await;
    let r = c
        .request(
            "GET",
            "/p/a?x=1",
            &[
                ("Host", "h.example"),
                ("X-Env", "dev"),
                ("X-Debug", "1"),
                ("X-Multi", "one"),
                ("x-origin", "forged"),
                ("Keep-Alive", "timeout=5"),
                ("Connection", "keep-alive, X-Hop"),
                ("X-Hop", "h"),
                ("X-Debug", "2"),
                ("Accept", "*/*"),
            ],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // Set and removed names lose every incoming line; hop-by-hop headers (and the one the
    // client's Connection named) are gone as always; other lines keep their order.
    assert_eq!(
        r.body_str(),
        format!(
            "GET /p/a?x=1 HTTP/1.1\r\nHost: h.example\r\nX-Multi: one\r\nAccept: */*\r\n\
             X-Env: prod\r\nX-Origin: http://h.example/p/a?x=1 q=x=1\r\nX-Multi: two\r\n{}\r\n",
            forwarded("h.example")
        )
    );
}

#[tokio::test]
async fn request_header_rule_may_replace_host() {
    let b = Backend::echo("up");
    let weir = route_with(
        b.addr(),
        &[r#"request_headers = { set = { Host = "internal.{host}" } }"#],
    )
    .start();
    let mut c = weir.client().await;
    let r = c.get("/", "a.example").await.unwrap();
    assert_eq!(
        r.body_str(),
        format!(
            "GET / HTTP/1.1\r\nHost: internal.a.example\r\n{}\r\n",
            forwarded("a.example")
        )
    );
}

#[tokio::test]
async fn response_header_rules_set_add_remove_with_variables() {
    let b = Backend::fixed(
        200,
        &[
            ("Server", "backend/1.0"),
            ("X-Keep", "1"),
            ("Strict-Transport-Security", "max-age=1"),
            ("X-Served", "a"),
        ],
        "ok",
    );
    let weir = route_with(
        b.addr(),
        &[r#"response_headers = { set = { "Strict-Transport-Security" = "max-age=63072000" }, add = { "X-Served" = "{path}" }, remove = ["server"] }"#],
    )
    .start();
    let mut c = weir.client().await;
    for path in ["/one?q", "/two"] {
        let r = c.get(path, "h").await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), "ok");
        assert_eq!(r.header("Server"), None);
        assert_eq!(r.header("X-Keep"), Some("1"));
        assert_eq!(
            r.headers_all("Strict-Transport-Security"),
            vec!["max-age=63072000"]
        );
        let want = path.split('?').next().unwrap();
        assert_eq!(r.headers_all("X-Served"), vec!["a", want]);
        // Framing stays Weir's: one Content-Length, the connection kept.
        assert_eq!(r.headers_all("Content-Length"), vec!["2"]);
        assert_eq!(r.header("Connection"), None);
    }
}

// ---------------------------------------------------------------- request ids

/// The values of every `name` line in a request head an echo backend reported.
fn head_values(echoed: &str, name: &str) -> Vec<String> {
    echoed
        .split("\r\n")
        .filter_map(|line| line.split_once(": "))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.to_string())
        .collect()
}

/// A JSON access log in a fresh file, removed on drop.
struct JsonLog {
    dir: std::path::PathBuf,
}

impl JsonLog {
    fn new(test: &str) -> JsonLog {
        let dir = std::env::temp_dir().join(format!("weir-policy-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        JsonLog { dir }
    }

    fn listener_line(&self) -> String {
        format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            self.dir.join("access.log").display()
        )
    }

    /// The log's lines once there are `n` (polls; the writer thread batches).
    fn lines(&self, n: usize) -> Vec<String> {
        let read = || std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        assert!(
            weir_testkit::wait_until(common::WAIT, || read().lines().count() >= n),
            "fewer than {n} access-log lines: {}",
            read()
        );
        read().lines().map(str::to_string).collect()
    }
}

impl Drop for JsonLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn request_ids_generated_kept_or_replaced_reach_upstream_and_log() {
    let b = Backend::echo("up");
    let log = JsonLog::new("ids");
    let weir = route_with(b.addr(), &[])
        .with_request_ids()
        .listener(&log.listener_line())
        .start();
    let mut c = weir.client().await;
    let mut sent = Vec::new();
    for client_id in [
        None,
        None,
        Some("0f8fad5b-d9cb-469f-a165-70867728950e"),
        Some("bad id"),
        Some(&*"x".repeat(129)),
    ] {
        let mut headers = vec![("Host", "h")];
        headers.extend(client_id.map(|id| ("X-Request-Id", id)));
        let r = c.request("GET", "/", &headers, b"").await.unwrap();
        let ids = head_values(&r.body_str(), "x-request-id");
        assert_eq!(ids.len(), 1, "exactly one id upstream: {}", r.body_str());
        sent.push(ids[0].clone());
    }
    let generated = |id: &str| {
        id.len() == 33
            && id.as_bytes()[16] == b'-'
            && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    };
    assert!(generated(&sent[0]) && generated(&sent[1]), "{sent:?}");
    assert_ne!(sent[0], sent[1]);
    assert_eq!(
        sent[2], "0f8fad5b-d9cb-469f-a165-70867728950e",
        "well formed: kept"
    );
    assert!(
        generated(&sent[3]) && generated(&sent[4]),
        "malformed: replaced {sent:?}"
    );
    let lines = log.lines(5);
    for (line, id) in lines.iter().zip(&sent) {
        assert!(
            line.contains(&format!("\"request_id\":\"{id}\"")),
            "{id} in {line}"
        );
    }
}

#[tokio::test]
async fn request_id_settings_header_untrusted_and_off() {
    let b = Backend::echo("up");
    let weir = route_with(b.addr(), &[])
        .with_request_ids()
        .listener(r#"request_id = { header = "X-Trace", trust_client = false }"#)
        .start();
    let mut c = weir.client().await;
    let headers = [
        ("Host", "h"),
        ("X-Trace", "client-chosen"),
        ("X-Trace", "two"),
    ];
    let r = c.request("GET", "/", &headers, b"").await.unwrap();
    let ids = head_values(&r.body_str(), "x-trace");
    assert_eq!(ids.len(), 1, "{}", r.body_str());
    assert_ne!(ids[0], "client-chosen", "not trusted: replaced");
    drop(weir);

    let log = JsonLog::new("off");
    let weir = route_with(
        b.addr(),
        &[r#"request_headers = { set = { "X-Id" = "[{request_id}]" } }"#],
    )
    .with_request_ids()
    .listener("request_id = false")
    .listener(&log.listener_line())
    .start();
    let mut c = weir.client().await;
    let headers = [("Host", "h"), ("X-Request-Id", "a b")];
    let r = c.request("GET", "/", &headers, b"").await.unwrap();
    // Off: the client's header passes like any other, {request_id} is empty.
    assert_eq!(head_values(&r.body_str(), "x-request-id"), vec!["a b"]);
    assert_eq!(head_values(&r.body_str(), "x-id"), vec!["[]"]);
    assert!(log.lines(1)[0].contains("\"request_id\":null"));
}
