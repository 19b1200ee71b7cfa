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
