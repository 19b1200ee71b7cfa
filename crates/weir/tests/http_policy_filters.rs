//! Issue 16's per-route traffic-policy filters over real sockets: header rules (both
//! directions, with variables), request ids, access lists with trusted proxies, rate limits
//! and basic auth. Weir's own answers (403, 429, 401) keep the connection like any other.

mod common;

use common::{forwarded, Conf, JsonLog};
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
        ("X_Trace", "client-chosen"),
    ];
    let r = c.request("GET", "/", &headers, b"").await.unwrap();
    let ids = head_values(&r.body_str(), "x-trace");
    assert_eq!(ids.len(), 1, "{}", r.body_str());
    assert_ne!(ids[0], "client-chosen", "not trusted: replaced");
    // Was: passed, and CGI-style servers read `X_Trace` as `X-Trace` (attacker review).
    assert!(
        head_values(&r.body_str(), "x_trace").is_empty(),
        "{}",
        r.body_str()
    );
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

// ---------------------------------------------------------------- access lists

/// Waits until the metric line `name_and_labels` has `want` (requests are counted just
/// after their answer is written).
fn wait_for_series(weir: &common::Weir, name_and_labels: &str, want: f64) {
    let value = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse::<f64>().ok())
    };
    let ok = weir_testkit::wait_until(common::WAIT, || value(&weir.metrics_text()) == Some(want));
    let text = weir.metrics_text();
    assert!(
        ok,
        "{name_and_labels}: want {want}, have {:?}\n{text}",
        value(&text)
    );
}

#[tokio::test]
async fn deny_wins_and_refusals_keep_the_connection() {
    let b = Backend::fixed(200, &[], "ok");
    let weir = Conf::new()
        .route(
            "closed",
            "up",
            &[r#"path_prefix = "/closed/""#, r#"deny = ["127.0.0.0/8"]"#],
        )
        .route(
            "both",
            "up",
            &[
                r#"path_prefix = "/both/""#,
                r#"allow = ["127.0.0.0/8", "::1"]"#,
                r#"deny = ["127.0.0.1"]"#,
            ],
        )
        .route(
            "open",
            "up",
            &[
                r#"path_prefix = "/open/""#,
                r#"deny = ["10.0.0.0/8", "2001:db8::/32"]"#,
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for path in ["/closed/x", "/both/x"] {
        let r = c
            .request(
                "POST",
                path,
                &[("Host", "h"), ("Content-Length", "3")],
                b"abc",
            )
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{path}");
        assert_eq!(r.body_str(), "Forbidden\n");
        assert_eq!(r.header("Connection"), None, "kept open");
    }
    // Same connection: the refused requests' bodies were skipped, the next one is served.
    let r = c.get("/open/x", "h").await.unwrap();
    assert_eq!((r.status, r.body_str().as_ref()), (200, "ok"));
    assert_eq!(b.requests_served(), 1);
    // An HTTP/1.0 keep-alive client is told the connection stays open.
    c.send_raw(b"GET /closed/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    let r = c.request("HEAD", "/closed/", &[("Host", "h")], b"").await;
    assert_eq!(r.unwrap().status, 403);
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"closed\",method=\"POST\",code=\"403\",protocol=\"HTTP/1.1\"}",
        1.0,
    );
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"closed\",method=\"GET\",code=\"403\",protocol=\"HTTP/1.1\"}",
        1.0,
    );
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"both\",method=\"POST\",code=\"403\",protocol=\"HTTP/1.1\"}",
        1.0,
    );
}

#[tokio::test]
async fn allow_list_refuses_everyone_else() {
    let b = Backend::fixed(200, &[], "ok");
    let weir = Conf::new()
        .route(
            "private",
            "up",
            &[r#"path_prefix = "/private/""#, r#"allow = ["10.0.0.0/8"]"#],
        )
        .route(
            "local",
            "up",
            &[
                r#"path_prefix = "/local/""#,
                r#"allow = ["10.0.0.0/8", "127.0.0.1/32"]"#,
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    assert_eq!(c.get("/private/", "h").await.unwrap().status, 403);
    assert_eq!(c.get("/local/", "h").await.unwrap().status, 200);
}

#[tokio::test]
async fn trusted_proxies_take_the_client_from_x_forwarded_for() {
    let b = Backend::echo("up");
    let log = JsonLog::new("xff");
    let weir = Conf::new()
        .listener(r#"trusted_proxies = ["127.0.0.1", "10.0.0.0/8"]"#)
        .listener(&log.listener_line())
        .route(
            "api",
            "up",
            &[
                r#"allow = ["203.0.113.0/24"]"#,
                r#"request_headers = { set = { "X-Client" = "{client_ip}" } }"#,
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    // The peer (127.0.0.1) itself is not allowed.
    assert_eq!(c.get("/", "h").await.unwrap().status, 403);
    // A forged entry left of the one the trusted hops added is not believed.
    let xff = [
        ("Host", "h"),
        ("X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.1.2.3"),
    ];
    let r = c.request("GET", "/", &xff, b"").await.unwrap();
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert_eq!(head_values(&body, "x-client"), vec!["203.0.113.9"]);
    assert_eq!(head_values(&body, "x-real-ip"), vec!["203.0.113.9"]);
    assert_eq!(
        head_values(&body, "x-forwarded-for"),
        vec!["198.51.100.1, 203.0.113.9, 10.1.2.3, 127.0.0.1"]
    );
    let forged = [
        ("Host", "h"),
        ("X-Forwarded-For", "203.0.113.9, 198.51.100.1"),
    ];
    assert_eq!(
        c.request("GET", "/", &forged, b"").await.unwrap().status,
        403
    );
    let lines = log.lines(3);
    assert!(
        lines[0].contains("\"client\":\"127.0.0.1\""),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("\"client\":\"203.0.113.9\""),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("\"client\":\"198.51.100.1\""),
        "{}",
        lines[2]
    );
}

#[tokio::test]
async fn x_forwarded_for_is_ignored_without_trusted_proxies() {
    let b = Backend::fixed(200, &[], "ok");
    let weir = route_with(b.addr(), &[r#"allow = ["203.0.113.0/24"]"#]).start();
    let mut c = weir.client().await;
    let xff = [("Host", "h"), ("X-Forwarded-For", "203.0.113.9")];
    assert_eq!(c.request("GET", "/", &xff, b"").await.unwrap().status, 403);
}

// ---------------------------------------------------------------- rate limits

#[tokio::test]
async fn rate_limit_burst_then_429_with_retry_after_on_a_kept_connection() {
    let b = Backend::fixed(200, &[], "ok");
    let weir = Conf::new()
        .route(
            "api",
            "up",
            &[r#"rate_limit = { rate = "1/h", burst = 3 }"#],
        )
        .route("free", "up", &[r#"path_prefix = "/free/""#])
        .upstream("up", &[b.addr()], &[])
        .start();
    wait_for_series(
        &weir,
        "weir_rate_limited_total{listener=\"web\",route=\"api\",protocol=\"HTTP/1.1\"}",
        0.0,
    );
    let mut c = weir.client().await;
    for i in 0..3 {
        assert_eq!(c.get("/", "h").await.unwrap().status, 200, "request {i}");
    }
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.body_str(), "Too Many Requests\n");
    assert_eq!(r.header("Connection"), None);
    let retry: u64 = r
        .header("Retry-After")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((3500..=3600).contains(&retry), "Retry-After {retry}");
    // Other routes and other clients' keys are not affected; the connection is kept.
    assert_eq!(c.get("/free/", "h").await.unwrap().status, 200);
    assert_eq!(b.requests_served(), 4);
    wait_for_series(
        &weir,
        "weir_rate_limited_total{listener=\"web\",route=\"api\",protocol=\"HTTP/1.1\"}",
        1.0,
    );
    // No HTTP/2 request came: no HTTP/2.0 row.
    let h2 = "weir_rate_limited_total{listener=\"web\",route=\"api\",protocol=\"HTTP/2.0\"}";
    assert_eq!(weir.metric_now(h2), None);
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"api\",method=\"GET\",code=\"429\",protocol=\"HTTP/1.1\"}",
        1.0,
    );
}

/// The status of `GET /` with `X-Api-Key: key`.
async fn keyed(c: &mut weir_testkit::Client, key: &str) -> u16 {
    let headers = [("Host", "h"), ("X-Api-Key", key)];
    c.request("GET", "/", &headers, b"").await.unwrap().status
}

#[tokio::test]
async fn rate_limit_keys_by_header_and_survives_a_reload() {
    let b = Backend::fixed(200, &[], "ok");
    let conf = |extra: &str| {
        Conf::new()
            .route(
                "api",
                "up",
                &[
                    r#"rate_limit = { rate = "1/h", burst = 2, key = "header:X-Api-Key" }"#,
                    extra,
                ],
            )
            .upstream("up", &[b.addr()], &[])
    };
    let weir = conf("").start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        assert_eq!(keyed(&mut c, "a").await, 200);
    }
    assert_eq!(keyed(&mut c, "a").await, 429);
    assert_eq!(keyed(&mut c, "b").await, 200);
    // A reload that leaves the limit as it is keeps the counts.
    weir.apply_text(&conf(r#"response_headers = { set = { "X-Reloaded" = "1" } }"#).toml())
        .unwrap();
    let r = c
        .request("GET", "/", &[("Host", "h"), ("X-Api-Key", "b")], b"")
        .await
        .unwrap();
    assert_eq!((r.status, r.header("X-Reloaded")), (200, Some("1")));
    let r = c
        .request("GET", "/", &[("Host", "h"), ("X-Api-Key", "b")], b"")
        .await
        .unwrap();
    assert_eq!((r.status, r.header("X-Reloaded")), (429, None));
    // A changed limit starts afresh.
    let changed = conf("").toml().replace("burst = 2", "burst = 1");
    weir.apply_text(&changed).unwrap();
    assert_eq!(keyed(&mut c, "a").await, 200);
    assert_eq!(keyed(&mut c, "a").await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_is_exact_across_two_workers() {
    let b = Backend::fixed(200, &[], "ok");
    let toml = Conf::new()
        .with_request_ids()
        .route(
            "limited",
            "up",
            &[r#"rate_limit = { rate = "1/h", burst = 10, key = "route" }"#],
        )
        .route(
            "who",
            "up",
            &[
                r#"path_prefix = "/who""#,
                r#"response_headers = { set = { "X-Id" = "{request_id}" } }"#,
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .toml();
    let config = weir_config::parse_str(&toml, "test.toml").unwrap();
    let proxy = weir_core::Proxy::start(config, 2).expect("start weir");
    let addr = proxy.listener_addr(common::LISTENER).unwrap();
    let mut workers = std::collections::HashSet::new();
    let (mut passed, mut limited) = (0, 0);
    for _ in 0..40 {
        let mut c = weir_testkit::Client::connect(addr).await.unwrap();
        // The id's prefix names the worker serving this connection.
        let who = c.get("/who", "h").await.unwrap();
        workers.insert(who.header("X-Id").unwrap()[..16].to_string());
        match c.get("/", "h").await.unwrap().status {
            200 => passed += 1,
            429 => limited += 1,
            s => panic!("status {s}"),
        }
    }
    assert_eq!(workers.len(), 2, "connections reached both workers");
    assert_eq!((passed, limited), (10, 30));
    proxy.shutdown();
}

// ---------------------------------------------------------------- basic auth

/// An htpasswd file in a fresh directory (removed on drop) with bcrypt entries.
struct Htpasswd {
    dir: std::path::PathBuf,
}

impl Htpasswd {
    fn new(test: &str, users: &[(&str, &str)]) -> Htpasswd {
        let dir = std::env::temp_dir().join(format!("weir-auth-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let h = Htpasswd { dir };
        h.write(users);
        h
    }

    fn write(&self, users: &[(&str, &str)]) {
        let lines: String = users
            .iter()
            .map(|(user, password)| {
                let hash = bcrypt::hash_with_salt(password, 4, [3u8; 16])
                    .unwrap()
                    .format_for_version(bcrypt::Version::TwoY);
                format!("{user}:{hash}\n")
            })
            .collect();
        std::fs::write(self.path(), format!("# test users\n{lines}")).unwrap();
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.join("htpasswd")
    }
}

impl Drop for Htpasswd {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `GET /` with `Authorization: Basic base64(credentials)` (none when empty).
async fn get_as(c: &mut weir_testkit::Client, base64: &str) -> weir_testkit::Response {
    let auth = format!("Basic {base64}");
    let mut headers = vec![("Host", "h")];
    if !base64.is_empty() {
        headers.push(("Authorization", &auth));
    }
    c.request("GET", "/", &headers, b"").await.unwrap()
}

const ALICE_SECRET: &str = "YWxpY2U6c2VjcmV0"; // alice:secret
const ALICE_WRONG: &str = "YWxpY2U6d3Jvbmc="; // alice:wrong
const ALICE_NEW: &str = "YWxpY2U6bmV3"; // alice:new

#[tokio::test]
async fn basic_auth_challenges_refuses_and_admits() {
    let b = Backend::fixed(200, &[], "ok");
    let users = Htpasswd::new("admit", &[("alice", "secret"), ("bob", "hunter2")]);
    let conf = route_with(
        b.addr(),
        &[&format!(
            "basic_auth = {{ users_file = \"{}\", realm = \"Staff only\" }}",
            users.path().display()
        )],
    );
    let weir = conf.start();
    let mut c = weir.client().await;
    for credentials in ["", ALICE_WRONG, "Ym9iOnNlY3JldA==", "!!!"] {
        let r = get_as(&mut c, credentials).await;
        assert_eq!(r.status, 401, "{credentials}");
        assert_eq!(
            r.header("WWW-Authenticate"),
            Some("Basic realm=\"Staff only\", charset=\"UTF-8\"")
        );
        assert_eq!(r.header("Connection"), None, "kept open");
    }
    assert_eq!(b.requests_served(), 0);
    // Right: admitted, and again (from the worker's cache of successful checks).
    for _ in 0..3 {
        assert_eq!(get_as(&mut c, ALICE_SECRET).await.status, 200);
    }
    assert_eq!(
        get_as(&mut c, "Ym9iOmh1bnRlcjI=").await.status,
        200,
        "bob:hunter2"
    );
    wait_for_series(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"api\",method=\"GET\",code=\"401\",protocol=\"HTTP/1.1\"}",
        4.0,
    );
}

/// An htpasswd file with `alice:secret` hashed at bcrypt cost 12 (a check takes long
/// enough to overlap others), and the route's `basic_auth` line naming it.
fn slow_alice(tag: &str) -> (Htpasswd, String) {
    let users = Htpasswd::new(tag, &[]);
    let hash = bcrypt::hash_with_salt("secret", 12, [3u8; 16])
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY);
    std::fs::write(users.path(), format!("alice:{hash}\n")).unwrap();
    let auth = format!(
        "basic_auth = {{ users_file = \"{}\" }}",
        users.path().display()
    );
    (users, auth)
}

/// A password check runs off the worker's event loop: while clients keep sending a wrong
/// password (bcrypt cost 12), requests on another route of the same worker are answered at
/// once. They waited behind the checks: a few of them took longer than one check.
#[tokio::test]
async fn wrong_password_floods_do_not_stall_other_requests() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let b = Backend::fixed(200, &[], "ok");
    let (_users, auth) = slow_alice("flood");
    let weir = route_with(b.addr(), &[&auth])
        .route("open", "up", &[r#"path_prefix = "/open/""#])
        .start();
    // One check alone, for scale.
    let mut c = weir.client().await;
    let started = std::time::Instant::now();
    assert_eq!(get_as(&mut c, ALICE_WRONG).await.status, 401);
    let one_check = started.elapsed();
    let (stop, answered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut flood = Vec::new();
    for _ in 0..3 {
        let mut c = weir.client().await;
        let (stop, answered) = (stop.clone(), answered.clone());
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(get_as(&mut c, ALICE_WRONG).await.status, 401);
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while answered.load(Ordering::Relaxed) < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood never got answers"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut open = weir.client().await;
    let started = std::time::Instant::now();
    for _ in 0..5 {
        let r = open.get("/open/x", "h").await.unwrap();
        assert_eq!(r.status, 200);
    }
    let five = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.unwrap();
    }
    assert!(
        five < one_check,
        "5 requests took {five:?}, one check {one_check:?}"
    );
}

/// `[server] password_checks` bounds the checks running at once: with one allowed and two
/// clients sending a wrong password (bcrypt cost 12), a check that finds the other under
/// way is answered 503 with `Retry-After` at once, not queued.
#[tokio::test]
async fn password_checks_past_the_limit_are_answered_503() {
    let b = Backend::fixed(200, &[], "ok");
    let (_users, auth) = slow_alice("limit");
    let weir = route_with(b.addr(), &[&auth])
        .server("password_checks = 1")
        .start();
    let (mut one, mut two) = (weir.client().await, weir.client().await);
    let deadline = tokio::time::Instant::now() + common::WAIT;
    let busy = loop {
        assert!(tokio::time::Instant::now() < deadline, "never 503");
        let (a, b) = tokio::join!(get_as(&mut one, ALICE_WRONG), get_as(&mut two, ALICE_WRONG));
        let mut statuses = [a.status, b.status];
        statuses.sort_unstable();
        match statuses {
            [401, 401] => continue,
            [401, 503] => break if a.status == 503 { a } else { b },
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(busy.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn basic_auth_reload_rereads_the_file_and_the_cache_follows() {
    let b = Backend::fixed(200, &[], "ok");
    let users = Htpasswd::new("reload", &[("alice", "secret")]);
    let conf = route_with(
        b.addr(),
        &[&format!(
            "basic_auth = {{ users_file = \"{}\" }}",
            users.path().display()
        )],
    );
    let weir = conf.start();
    let mut c = weir.client().await;
    assert_eq!(get_as(&mut c, ALICE_SECRET).await.status, 200);
    let r = get_as(&mut c, "").await;
    assert_eq!(
        r.header("WWW-Authenticate"),
        Some("Basic realm=\"Restricted\", charset=\"UTF-8\"")
    );
    // A new password: the cached success of the old one no longer admits.
    users.write(&[("alice", "new")]);
    weir.apply_text(&conf.toml()).unwrap();
    assert_eq!(get_as(&mut c, ALICE_SECRET).await.status, 401);
    assert_eq!(get_as(&mut c, ALICE_NEW).await.status, 200);
    // A removed user: refused, cache or not.
    users.write(&[("carol", "x")]);
    weir.apply_text(&conf.toml()).unwrap();
    assert_eq!(get_as(&mut c, ALICE_NEW).await.status, 401);
}

// ---------------------------------------------------------------- all on one route

#[tokio::test]
async fn every_filter_on_one_route() {
    let b = Backend::echo("up");
    let users = Htpasswd::new("combined", &[("alice", "secret")]);
    let weir = route_with(
        b.addr(),
        &[
            r#"allow = ["127.0.0.0/8"]"#,
            r#"deny = ["127.0.0.2"]"#,
            r#"rate_limit = { rate = "1/h", burst = 3 }"#,
            &format!(
                "basic_auth = {{ users_file = \"{}\" }}",
                users.path().display()
            ),
            r#"request_headers = { set = { "X-Env" = "prod" }, remove = ["X-Debug"] }"#,
            r#"response_headers = { set = { "X-Request-Id" = "{request_id}" } }"#,
        ],
    )
    .with_request_ids()
    .start();
    let mut c = weir.client().await;
    // Unauthenticated: 401, and it counts against the rate limit (which runs first).
    assert_eq!(get_as(&mut c, "").await.status, 401);
    let headers = [
        ("Host", "h"),
        ("Authorization", "Basic YWxpY2U6c2VjcmV0"),
        ("X-Debug", "1"),
        ("X-Request-Id", "client-7"),
    ];
    let r = c.request("GET", "/", &headers, b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Request-Id"), Some("client-7"));
    let body = r.body_str();
    assert_eq!(head_values(&body, "x-env"), vec!["prod"]);
    assert!(head_values(&body, "x-debug").is_empty());
    assert_eq!(head_values(&body, "x-request-id"), vec!["client-7"]);
    assert_eq!(get_as(&mut c, ALICE_SECRET).await.status, 200);
    let r = get_as(&mut c, ALICE_SECRET).await;
    assert_eq!(r.status, 429);
    assert!(r.header("Retry-After").is_some());
    assert_eq!(b.requests_served(), 2);
}

#[tokio::test]
async fn basic_auth_accepts_argon2_entries() {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let b = Backend::fixed(200, &[], "ok");
    let users = Htpasswd::new("argon2", &[]);
    let salt = SaltString::encode_b64(&[9u8; 16]).unwrap();
    let params = argon2::Params::new(256, 1, 1, None).unwrap();
    let hasher = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let hash = hasher.hash_password(b"secret", &salt).unwrap();
    std::fs::write(users.path(), format!("alice:{hash}\n")).unwrap();
    let weir = route_with(
        b.addr(),
        &[&format!(
            "basic_auth = {{ users_file = \"{}\" }}",
            users.path().display()
        )],
    )
    .start();
    let mut c = weir.client().await;
    assert_eq!(get_as(&mut c, ALICE_WRONG).await.status, 401);
    assert_eq!(get_as(&mut c, ALICE_SECRET).await.status, 200);
}

#[tokio::test]
async fn a_host_rule_does_not_stop_retries_on_another_server() {
    let dead = common::dead_port();
    let b = Backend::echo("up");
    let weir = Conf::new()
        .route(
            "api",
            "up",
            &[
                "preserve_host = false",
                r#"request_headers = { set = { Host = "api.internal" } }"#,
            ],
        )
        .upstream(
            "up",
            &[dead.addr, b.addr()],
            &[
                "lb = \"round_robin\"",
                "retry = { attempts = 1, on = [\"connect_error\"] }",
            ],
        )
        .start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        let r = c.get("/", "public.example").await.unwrap();
        assert_eq!(r.status, 200, "retried on the live server");
        assert_eq!(head_values(&r.body_str(), "host"), vec!["api.internal"]);
    }
}

/// A route that sets `X-User` and removes `X-Internal-Auth`; the client's spellings with
/// `_` (`HTTP_X_USER` to a WSGI or CGI backend, as Weir's own `X-User`) must not pass.
const UNDERSCORE_RULES: &str =
    r#"request_headers = { set = { "X-User" = "anonymous" }, remove = ["X-Internal-Auth"] }"#;
const UNDERSCORE_SPELLINGS: [(&str, &str); 4] = [
    ("X_User", "admin"),
    ("x_internal_auth", "yes"),
    ("X-Internal_Auth", "yes"),
    ("X_Other", "kept"),
];

/// Was: `X_User` and `X_Internal_Auth` reached the upstream beside Weir's `X-User`
/// (attacker review); names that only look alike (`X_Other`) still pass.
#[tokio::test]
async fn header_rules_drop_the_underscore_spelling_over_http1() {
    let b = Backend::echo("up");
    let weir = route_with(b.addr(), &[UNDERSCORE_RULES]).start();
    let mut c = weir.client().await;
    let mut headers = vec![("Host", "h.example")];
    headers.extend(UNDERSCORE_SPELLINGS);
    let r = c.request("GET", "/p", &headers, b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        format!(
            "GET /p HTTP/1.1\r\nHost: h.example\r\nX_Other: kept\r\nX-User: anonymous\r\n{}\r\n",
            forwarded("h.example")
        )
    );
}

#[tokio::test]
async fn header_rules_drop_the_underscore_spelling_over_http2() {
    let b = Backend::echo("up");
    let weir = route_with(b.addr(), &[UNDERSCORE_RULES]).start();
    let mut h2 = common::h2c_client(weir.addr).await;
    let (status, _, body) = common::h2_get(&mut h2, "/p", &UNDERSCORE_SPELLINGS).await;
    assert_eq!(status, 200);
    let seen = String::from_utf8_lossy(&body).to_ascii_lowercase();
    assert!(seen.contains("\r\nx_other: kept\r\n"), "{seen}");
    assert!(seen.contains("\r\nx-user: anonymous\r\n"), "{seen}");
    for gone in [
        "x_user",
        "x_internal_auth",
        "x-internal_auth",
        "admin",
        "yes",
    ] {
        assert!(!seen.contains(gone), "{gone} in {seen}");
    }
}

/// Was: `X-Forwarded-For: 198.51.100.7` and `::ffff:198.51.100.7` (the same client, behind
/// trusted proxies) were counted in two buckets (attacker review); and `{client_ip}` says
/// the one spelling.
#[tokio::test]
async fn an_ipv4_mapped_client_shares_its_ipv4_rate_limit_bucket() {
    let b = Backend::echo("up");
    let weir = Conf::new()
        .listener(r#"trusted_proxies = ["127.0.0.1"]"#)
        .route(
            "api",
            "up",
            &[
                r#"rate_limit = { rate = "1/h", burst = 1 }"#,
                r#"request_headers = { set = { "X-Client" = "{client_ip}" } }"#,
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let get = |xff: &'static str| [("Host", "h"), ("X-Forwarded-For", xff)];
    let first = c
        .request("GET", "/", &get("::ffff:198.51.100.7"), b"")
        .await;
    let first = first.unwrap();
    assert_eq!(first.status, 200);
    assert!(first.body_str().contains("\r\nX-Client: 198.51.100.7\r\n"));
    let second = c.request("GET", "/", &get("198.51.100.7"), b"").await;
    assert_eq!(second.unwrap().status, 429);
    let other = c.request("GET", "/", &get("198.51.100.8"), b"").await;
    assert_eq!(other.unwrap().status, 200);
}
