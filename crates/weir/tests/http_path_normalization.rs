//! Issue 17 item 7: dot segments must not escape a prefix route. Requests are routed on
//! their normalised path (`[listeners.path_normalization]`), that path is what the upstream
//! receives, paths climbing above `/` get 400, and the access log keeps the original target.

mod common;

use common::{upstream_head, Conf, Weir, WAIT};
use weir_testkit::{send_raw_once, status_of, wait_until, Backend};

/// Weir routing `/public/` to backend "public" and `/admin` to backend "admin"; `settings`
/// are extra listener lines.
fn public_and_admin(public: &Backend, admin: &Backend, settings: &[&str]) -> Weir {
    public_and_admin_conf(public, admin, settings).start()
}

fn public_and_admin_conf(public: &Backend, admin: &Backend, settings: &[&str]) -> Conf {
    let mut conf = Conf::new()
        .route("public", "public", &[r#"path_prefix = "/public/""#])
        .route("admin", "admin", &[r#"path_prefix = "/admin""#])
        .upstream("public", &[public.addr()], &[])
        .upstream("admin", &[admin.addr()], &[]);
    for line in settings {
        conf = conf.listener(line);
    }
    conf
}

/// Asserts that `path` was answered by `backend`, which received `GET <upstream> HTTP/1.1`.
async fn expect_routed(weir: &Weir, path: &str, backend: &str, upstream: &str) {
    let mut c = weir.client().await;
    let r = c.get(path, "h.test").await.unwrap();
    assert_eq!(r.status, 200, "{path}");
    assert_eq!(r.header("x-backend"), Some(backend), "{path}");
    assert_eq!(
        r.body_str(),
        upstream_head(&format!("GET {upstream} HTTP/1.1"), "h.test", ""),
        "{path}"
    );
}

/// Asserts that `target` is answered with `status` by Weir itself.
async fn expect_status(weir: &Weir, target: &str, status: u16) {
    let req = format!("GET {target} HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n");
    let resp = send_raw_once(weir.addr, req.as_bytes()).await.unwrap();
    assert_eq!(
        status_of(&resp),
        Some(status),
        "{target}: {}",
        String::from_utf8_lossy(&resp)
    );
}

#[tokio::test]
async fn dot_segments_do_not_escape_a_prefix_route() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(&public, &admin, &[]);
    for (path, upstream) in [
        ("/public/../admin", "/admin"),
        ("/public/%2e%2e/admin", "/admin"),
        ("/public/%2E%2e/admin/x", "/admin/x"),
        (
            "/public/.%2e/admin?next=/../public/",
            "/admin?next=/../public/",
        ),
        ("/public/./../admin/./panel", "/admin/panel"),
        ("/public/a/../../admin", "/admin"),
    ] {
        expect_routed(&weir, path, "admin", upstream).await;
    }
    // Within the route, the upstream receives the normalised path too.
    for (path, upstream) in [
        ("/public/./a/../b", "/public/b"),
        ("/public/%7Euser/", "/public/~user/"),
        ("/public/a//b", "/public/a//b"),
    ] {
        expect_routed(&weir, path, "public", upstream).await;
    }
    assert_eq!(public.requests_served(), 3);
    // Absolute form: its path is normalised the same way.
    let mut c = weir.client().await;
    c.send_raw(b"GET http://h.test/public/../admin HTTP/1.1\r\nHost: h.test\r\n\r\n")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.header("x-backend"), Some("admin"));
    assert!(
        r.body_str().starts_with("GET /admin HTTP/1.1\r\n"),
        "{}",
        r.body_str()
    );
}

#[tokio::test]
async fn without_a_route_for_the_resolved_path_the_default_response_answers() {
    let public = Backend::echo("public");
    let weir = Conf::new()
        .route("public", "public", &[r#"path_prefix = "/public/""#])
        .upstream("public", &[public.addr()], &[])
        .start();
    for path in ["/public/../admin", "/public/%2e%2e/admin", "/public/.."] {
        let mut c = weir.client().await;
        let r = c.get(path, "h.test").await.unwrap();
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.body_str(), "no route\n");
    }
    assert_eq!(
        public.requests_served(),
        0,
        "nothing reached the /public/ upstream"
    );
}

#[tokio::test]
async fn paths_climbing_above_the_root_and_encoded_slashes_are_refused() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(&public, &admin, &[]);
    for target in [
        "/..",
        "/../admin",
        "/public/../../etc/passwd",
        "/%2e%2e/admin",
        "/public/..%2Fadmin",
        "/public/..%2fadmin",
        "/public/..%5Cadmin",
        "/public/..\\admin",
        "/public/%zz",
        // Tomcat would resolve this to /admin.
        "/public/..;/admin",
    ] {
        expect_status(&weir, target, 400).await;
    }
    // The query is not part of the path.
    expect_routed(
        &weir,
        "/public/x?to=/../%2F..",
        "public",
        "/public/x?to=/../%2F..",
    )
    .await;
    assert_eq!(admin.requests_served(), 0);
    assert_eq!(public.requests_served(), 1);
}

/// Issue 24 item 3: an escaped control character in the path (`%00` above all: a server
/// that decodes the path may cut it there, `/public/..%00/etc/passwd`) is refused with 400
/// before any upstream, with normalisation on or all off; a raw one never passes the
/// parser; the query may carry them.
#[tokio::test]
async fn control_characters_in_the_path_are_refused() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let off = r#"path_normalization = { dot_segments = false, encoded_slash = "keep" }"#;
    for settings in [&[][..], &[off][..]] {
        let weir = public_and_admin(&public, &admin, settings);
        for target in [
            "/public/..%00/etc/passwd",
            "/public/a%00",
            "/public/%0d%0aX-Injected:%201",
            "/public/%09",
            "/public/%1f",
            "/public/%7F",
            "/public/\x00",
            "/public/\x01",
            "/public/\x7f",
        ] {
            expect_status(&weir, target, 400).await;
        }
        expect_routed(&weir, "/public/x?q=%00", "public", "/public/x?q=%00").await;
    }
    assert_eq!(admin.requests_served(), 0);
    assert_eq!(public.requests_served(), 2);
}

/// No request-target form has a fragment (RFC 9112 3.2). The normaliser ends the path only at
/// `?`, so `/public/..#/admin` would match `/public/` as is, and a backend that drops the
/// fragment and then resolves `..` would serve `/`: refused with 400 before routing.
#[tokio::test]
async fn a_fragment_in_the_target_is_refused() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(&public, &admin, &[]);
    for target in [
        "/public/..#/admin",
        "/public/..#",
        "/public/.#",
        "/public/x#frag",
        "/public/x?q=1#frag",
        "http://h.test/public/..#/admin",
        "http://h.test#/public/",
    ] {
        expect_status(&weir, target, 400).await;
    }
    assert_eq!(public.requests_served() + admin.requests_served(), 0);
}

#[tokio::test]
async fn encoded_slash_keep_and_decode() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let keep = public_and_admin(
        &public,
        &admin,
        &[r#"path_normalization = { encoded_slash = "keep" }"#],
    );
    // Opaque: one segment named "..%2Fadmin" inside /public/, forwarded with upper-case hex.
    expect_routed(&keep, "/public/..%2fadmin", "public", "/public/..%2Fadmin").await;
    let decode = public_and_admin(
        &public,
        &admin,
        &[r#"path_normalization = { encoded_slash = "decode" }"#],
    );
    expect_routed(&decode, "/public/..%2Fadmin", "admin", "/admin").await;
    expect_routed(&decode, "/public/..%5cadmin", "admin", "/admin").await;
    expect_status(&decode, "/public/..%2F..%2F..", 400).await;
}

#[tokio::test]
async fn merge_slashes_when_asked() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(&public, &admin, &[]);
    // Off by default: "//admin" does not start with "/admin".
    expect_status(&weir, "//admin", 404).await;
    let merged = public_and_admin(
        &public,
        &admin,
        &["path_normalization = { merge_slashes = true }"],
    );
    expect_routed(&merged, "//admin", "admin", "/admin").await;
    expect_routed(&merged, "/public//a///b", "public", "/public/a/b").await;
}

/// Documented as unsafe: the raw path is routed and forwarded.
#[tokio::test]
async fn dot_segments_off_routes_on_the_raw_path() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(
        &public,
        &admin,
        &["path_normalization = { dot_segments = false }"],
    );
    expect_routed(&weir, "/public/../admin", "public", "/public/../admin").await;
}

#[tokio::test]
async fn rewrite_prefix_applies_to_the_normalised_path() {
    let cgi = Backend::echo("cgi");
    let weir = Conf::new()
        .route(
            "cgi",
            "cgi",
            &[r#"path_prefix = "/cgi/""#, r#"rewrite_prefix = "/""#],
        )
        .upstream("cgi", &[cgi.addr()], &[])
        .start();
    expect_routed(&weir, "/cgi/a/../bin/./x.pl?q=..", "cgi", "/bin/x.pl?q=..").await;
    expect_routed(&weir, "/cgi/%2e/x", "cgi", "/x").await;
    // Resolves outside /cgi/: no route.
    expect_status(&weir, "/cgi/../x", 404).await;
    assert_eq!(cgi.requests_served(), 2);
}

/// `path_prefix = "/api"` with `rewrite_prefix = "/v1/"`: `/api../secret` is normal (its
/// segment is `api..`), but the plain substitution would send `/v1/../secret`, which the
/// server resolves to `/secret`, outside the route. Weir refuses what the join would turn
/// into a dot segment and forwards the rest as nginx and Apache would.
#[tokio::test]
async fn a_rewrite_never_makes_a_dot_segment() {
    let api = Backend::echo("api");
    let weir = Conf::new()
        .route(
            "api",
            "api",
            &[r#"path_prefix = "/api""#, r#"rewrite_prefix = "/v1/""#],
        )
        .upstream("api", &[api.addr()], &[])
        .start();
    for target in [
        "/api../secret",
        "/api..",
        "/api.",
        "/api./x",
        "/api..?q=1",
        "/api%2e%2e/secret",
        "/api..;x/secret",
    ] {
        expect_status(&weir, target, 400).await;
    }
    assert_eq!(api.requests_served(), 0);
    expect_routed(&weir, "/apix", "api", "/v1/x").await;
    expect_routed(&weir, "/api...", "api", "/v1/...").await;
    expect_routed(&weir, "/api", "api", "/v1/").await;
    assert_eq!(api.requests_served(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_keeps_the_original_target() {
    let dir = std::env::temp_dir().join(format!("weir-path-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let _ = std::fs::remove_file(&path);
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let log = format!(
        "access_log = {{ format = \"json\", path = \"{}\" }}",
        path.display()
    );
    let weir = public_and_admin(&public, &admin, &[&log]);
    expect_routed(&weir, "/public/%2e%2e/admin", "admin", "/admin").await;
    expect_status(&weir, "/public/../..", 400).await;
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        wait_until(WAIT, || read().lines().count() == 2),
        "log: {}",
        read()
    );
    let lines = read();
    let mut lines = lines.lines();
    let first = lines.next().unwrap();
    assert!(
        first.contains("\"target\":\"/public/%2e%2e/admin\""),
        "{first}"
    );
    assert!(first.contains("\"route\":\"admin\""), "{first}");
    let second = lines.next().unwrap();
    assert!(second.contains("\"target\":\"/public/../..\""), "{second}");
    assert!(second.contains("\"status\":400"), "{second}");
    drop(weir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_reload_changes_the_settings_for_the_next_request() {
    let public = Backend::echo("public");
    let admin = Backend::echo("admin");
    let weir = public_and_admin(&public, &admin, &[]);
    expect_status(&weir, "/public/..%2Fadmin", 400).await;
    let decode = public_and_admin_conf(
        &public,
        &admin,
        &[r#"path_normalization = { encoded_slash = "decode" }"#],
    );
    weir.apply_text(&decode.toml()).unwrap();
    expect_routed(&weir, "/public/..%2Fadmin", "admin", "/admin").await;
}

/// Weir with a redirect `to = "{path}/"` on `/r/`, header rules reading `{path}` and
/// `{uri}` on `/hdr/` (to `echo`), and a catch-all redirect `to = "{path}/"`.
fn variables_conf(echo: &Backend) -> Weir {
    Conf::new()
        .route_keys(
            "slash",
            &[r#"path_prefix = "/r/""#, r#"redirect = { to = "{path}/" }"#],
        )
        .route(
            "hdr",
            "echo",
            &[
                r#"path_prefix = "/hdr/""#,
                r#"request_headers = { set = { "X-Path" = "{path}" } }"#,
                r#"response_headers = { set = { "X-Uri" = "{uri}" } }"#,
            ],
        )
        .route_keys(
            "any",
            &[r#"path_prefix = "/""#, r#"redirect = { to = "{path}/" }"#],
        )
        .upstream("echo", &[echo.addr()], &[])
        .start()
}

/// (target, Location) of the redirects: the routed path, never `//` to another site.
/// (A raw `\` is refused by default, `encoded_slash`; the redirect's unit tests cover it.)
const REDIRECTS: [(&str, &str); 3] = [
    ("//evil.com/../../r/x", "/r/x/"),
    ("//evil.com/%2e%2e/%2e%2e/r/x", "/r/x/"),
    ("//evil.com/x", "/evil.com/x/"),
];

/// Was: `{path}` and `{uri}` were the raw target, so `//evil.com/../../r/x` (routed as
/// `/r/x`) was redirected to `//evil.com/../../r/x/`, another site (attacker review), and
/// a header rule's `{path}` said another path than the one forwarded.
#[tokio::test]
async fn variables_are_the_routed_path_over_http1() {
    let echo = Backend::echo("echo");
    let weir = variables_conf(&echo);
    let mut c = weir.client().await;
    for (target, location) in REDIRECTS {
        let r = c.get(target, "h.test").await.unwrap();
        assert_eq!(
            (r.status, r.header("location")),
            (302, Some(location)),
            "{target}"
        );
    }
    let r = c.get("//evil.com/../../hdr/x?q=1", "h.test").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-uri"), Some("/hdr/x?q=1"));
    let seen = r.body_str();
    assert!(seen.starts_with("GET /hdr/x?q=1 HTTP/1.1\r\n"), "{seen}");
    assert!(seen.contains("\r\nX-Path: /hdr/x\r\n"), "{seen}");
}

#[tokio::test]
async fn variables_are_the_routed_path_over_http2() {
    let echo = Backend::echo("echo");
    let weir = variables_conf(&echo);
    let mut h2 = common::h2c_client(weir.addr).await;
    for (target, location) in REDIRECTS {
        let (status, head, _) = h2_get_raw_path(&mut h2, target).await;
        let got = head.get("location").and_then(|v| v.to_str().ok());
        assert_eq!((status, got), (302, Some(location)), "{target}");
    }
    let (status, head, body) = h2_get_raw_path(&mut h2, "//evil.com/../../hdr/x?q=1").await;
    assert_eq!(status, 200);
    assert_eq!(head.get("x-uri").unwrap(), "/hdr/x?q=1");
    let seen = String::from_utf8_lossy(&body);
    assert!(seen.starts_with("GET /hdr/x?q=1 HTTP/1.1\r\n"), "{seen}");
    assert!(seen.contains("\r\nX-Path: /hdr/x\r\n"), "{seen}");
}

/// Was: `to = "https://{host}{path}"` rendered an HTTP/1.0 request without `Host` as
/// `https:///evil.com/x` (or `https:////evil.com/x` for `//evil.com/x`), which browsers
/// read as a URL on evil.com (attacker review). Now 400; with a Host, the redirect as before.
#[tokio::test]
async fn a_redirect_naming_the_host_needs_one() {
    let weir = Conf::new()
        .route_keys(
            "secure",
            &[
                r#"path_prefix = "/""#,
                r#"redirect = { to = "https://{host}{path}", status = 301 }"#,
            ],
        )
        .start();
    for target in ["/evil.com/x", "//evil.com/x"] {
        let request = format!("GET {target} HTTP/1.0\r\n\r\n");
        let raw = send_raw_once(weir.addr, request.as_bytes()).await.unwrap();
        let (head, _) = common::split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 400 "), "{target}: {head}");
        assert!(!head.to_ascii_lowercase().contains("location"), "{head}");
        let request = format!("GET {target} HTTP/1.0\r\nHost: .\r\n\r\n");
        let raw = send_raw_once(weir.addr, request.as_bytes()).await.unwrap();
        assert_eq!(status_of(&raw), Some(400), "Host: .");
    }
    let mut c = weir.client().await;
    let r = c.get("//evil.com/x", "h.test").await.unwrap();
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("https://h.test//evil.com/x"))
    );
}

/// An h2 `GET` whose `:path` is `path` exactly (`//...` is not a URL's path to `http`):
/// its status, fields and body.
async fn h2_get_raw_path(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
) -> (u16, http::HeaderMap, Vec<u8>) {
    let uri = http::Uri::builder()
        .scheme("http")
        .authority("h.test")
        .path_and_query(path)
        .build()
        .expect("uri");
    let request = http::Request::get(uri).body(()).unwrap();
    let ready = h2.clone().ready().await.expect("h2 ready");
    *h2 = ready;
    let (response, _) = h2.send_request(request, true).unwrap();
    let got = common::read_with_interims(response).await;
    let (head, ()) = got.head.into_parts();
    (head.status.as_u16(), head.headers, got.body)
}
