//! Issue 16, routing part: `exact`, `methods`, `match_headers`, `match_query` (precedence
//! and fall-through), local answers (`respond`, `redirect`, listener `redirect_https`) with
//! the keep-alive behaviour of the default response, weighted splits over pools, and
//! `weir check` rejecting bad route targets with a fix.

mod common;
mod support_process;

use std::time::Duration;

use common::{Conf, Weir, WAIT};
use support_process::{weir_check, TempDir};
use weir_testkit::{send_raw_once, status_of, wait_until, Backend, Client};

/// Polls until the metrics text has the line `series value` (a request is recorded just
/// after its last byte is sent).
#[track_caller]
fn wait_for_line(weir: &Weir, line: &str) {
    let ok = wait_until(WAIT, || weir.metrics_text().lines().any(|l| l == line));
    assert!(ok, "{line} in:\n{}", weir.metrics_text());
}

/// The `x-backend` header of a `GET path` with extra header lines `headers`.
async fn backend_of(c: &mut Client, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let r = c
        .request(method, path, headers, b"")
        .await
        .expect("response");
    assert_eq!(r.status, 200, "{method} {path} {headers:?}");
    r.header("x-backend").unwrap_or("(local)").to_owned()
}

/// Local answers are not default responses (`weir_default_responses_total` stays at 0).
#[track_caller]
fn assert_no_default_responses(weir: &Weir) {
    let metrics = weir.metrics_text();
    let counted = metrics
        .lines()
        .filter(|l| l.starts_with("weir_default_responses_total"))
        .any(|l| !l.ends_with(" 0"));
    assert!(!counted, "{metrics}");
}

#[tokio::test]
async fn exact_path_before_prefix() {
    let prefix = Backend::echo("prefix");
    let weir = Conf::new()
        .route("prefix", "p", &[r#"path_prefix = "/ping""#])
        .route_keys(
            "ping",
            &[
                r#"path_prefix = "/ping""#,
                "exact = true",
                r#"respond = { status = 200, body = "pong\n" }"#,
            ],
        )
        .upstream("p", &[prefix.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (path, expected) in [
        ("/ping", "(local)"),
        ("/ping?verbose=1", "(local)"),
        ("/ping/", "prefix"),
        ("/pingx", "prefix"),
        ("/ping/deeper", "prefix"),
    ] {
        assert_eq!(
            backend_of(&mut c, "GET", path, &[]).await,
            expected,
            "{path}"
        );
    }
    assert_eq!(prefix.requests_served(), 3);
}

#[tokio::test]
async fn methods_fall_through_to_the_next_route() {
    let writes = Backend::echo("writes");
    let rest = Backend::echo("rest");
    let weir = Conf::new()
        .route(
            "writes",
            "w",
            &[r#"path_prefix = "/api/""#, r#"methods = ["POST", "PUT"]"#],
        )
        .route("rest", "r", &[r#"path_prefix = "/api/""#])
        .upstream("w", &[writes.addr()], &[])
        .upstream("r", &[rest.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (method, expected) in [
        ("POST", "writes"),
        ("PUT", "writes"),
        ("GET", "rest"),
        ("DELETE", "rest"),
        ("post", "rest"),
    ] {
        assert_eq!(
            backend_of(&mut c, method, "/api/x", &[]).await,
            expected,
            "{method}"
        );
    }
}

/// A request path, its extra headers, and the backend it must reach.
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[tokio::test]
async fn header_and_query_conditions() {
    let canary = Backend::echo("canary");
    let debug = Backend::echo("debug");
    let beta = Backend::echo("beta");
    let stable = Backend::echo("stable");
    let weir = Conf::new()
        .route("canary", "c", &[r#"match_headers = { "X-Canary" = "1" }"#])
        .route("debug", "d", &[r#"match_headers = { "x-debug" = "*" }"#])
        .route(
            "beta",
            "b",
            &[r#"match_query = { beta = "true", v = "*" }"#],
        )
        .route("stable", "s", &[])
        .upstream("c", &[canary.addr()], &[])
        .upstream("d", &[debug.addr()], &[])
        .upstream("b", &[beta.addr()], &[])
        .upstream("s", &[stable.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let cases: [Case; 10] = [
        ("/", &[("x-canary", "1")], "canary"),
        ("/", &[("X-CANARY", "1")], "canary"),
        ("/", &[("X-Canary", "2")], "stable"),
        ("/", &[("X-Canary", "11")], "stable"),
        ("/", &[("X-Debug", "")], "debug"),
        ("/", &[("X-Debug", "anything")], "debug"),
        ("/?beta=true&v", &[], "beta"),
        ("/?v=3&beta=true", &[], "beta"),
        ("/?beta=true", &[], "stable"),
        ("/?beta=false&v=1", &[], "stable"),
    ];
    for (path, headers, expected) in cases {
        assert_eq!(
            backend_of(&mut c, "GET", path, headers).await,
            expected,
            "{path} {headers:?}"
        );
    }
}

/// A respond route and the metrics it counts in.
fn respond_conf() -> Conf {
    Conf::new().route_keys(
        "maint",
        &[
            r#"path_prefix = "/maint""#,
            r#"respond = { status = 503, body = "back soon\n", headers = { "Retry-After" = "120", "Content-Type" = "text/plain; charset=utf-8" } }"#,
        ],
    )
}

#[tokio::test]
async fn respond_status_body_headers_and_head() {
    let weir = respond_conf().start();
    let mut c = weir.client().await;
    let r = c.get("/maint/x", "h").await.unwrap();
    assert_eq!((r.status, r.body_str().as_ref()), (503, "back soon\n"));
    assert_eq!(r.header("retry-after"), Some("120"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some("10"));
    assert_eq!(
        r.header("connection"),
        None,
        "HTTP/1.1 keep-alive says nothing"
    );
    let head = c.request("HEAD", "/maint", &[], b"").await.unwrap();
    assert_eq!((head.status, head.body.len()), (503, 0));
    assert_eq!(head.header("content-length"), Some("10"));
    // A request body is consumed: the next request on the connection is answered.
    let post = c
        .request("POST", "/maint", &[], b"some body")
        .await
        .unwrap();
    assert_eq!(post.status, 503);
    let again = c.get("/maint", "h").await.unwrap();
    assert_eq!(again.body_str(), "back soon\n");
    for (method, n) in [("GET", 2), ("HEAD", 1), ("POST", 1)] {
        wait_for_line(
            &weir,
            &format!(
                "weir_requests_total{{listener=\"web\",route=\"maint\",method=\"{method}\",code=\"503\",protocol=\"HTTP/1.1\"}} {n}"
            ),
        );
    }
    assert_no_default_responses(&weir);
}

#[tokio::test]
async fn respond_keeps_http10_keep_alive_and_closes_on_unread_body() {
    let weir = respond_conf().start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        c.send_raw(b"GET /maint HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let r = c.read_response(false).await.unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    // Plain HTTP/1.0: Connection: close, then closed.
    let raw = send_raw_once(weir.addr, b"GET /maint HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("Connection: close\r\n"), "{text}");
    // A body that has not arrived yet is not waited for: the answer says close and closes.
    let mut c = weir.client().await;
    c.send_raw(b"POST /maint HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!((r.status, r.header("connection")), (503, Some("close")));
    assert!(c.is_closed_by_peer().await);
}

#[tokio::test]
async fn redirect_variables_and_every_status() {
    let mut conf = Conf::new();
    for status in [301, 302, 303, 307, 308] {
        conf = conf.route_keys(
            &format!("r{status}"),
            &[
                &format!("path_prefix = \"/{status}/\""),
                &format!(
                    "redirect = {{ to = \"https://{{host}}:8443{{path}}?q={{query}}&ip={{client_ip}}&s={{scheme}}&u={{uri}}\", status = {status} }}"
                ),
            ],
        );
    }
    let weir = conf
        .route_keys(
            "default-status",
            &["path_prefix = \"/old/\"", "redirect = { to = \"/new/\" }"],
        )
        .start();
    let mut c = weir.client().await;
    for status in [301, 302, 303, 307, 308] {
        let path = format!("/{status}/a/b?x=1&y");
        let r = c.get(&path, "Example.com:8080").await.unwrap();
        assert_eq!(r.status, status);
        assert_eq!(
            r.header("location"),
            Some(
                format!(
                    "https://Example.com:8443/{status}/a/b?q=x=1&y&ip=127.0.0.1&s=http&u={path}"
                )
                .as_str()
            )
        );
        assert_eq!((r.header("content-length"), r.body.len()), (Some("0"), 0));
    }
    let r = c.get("/old/page", "h").await.unwrap();
    assert_eq!((r.status, r.header("location")), (302, Some("/new/")));
    let head = c.request("HEAD", "/old/x", &[], b"").await.unwrap();
    assert_eq!(head.status, 302);
    wait_for_line(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"r308\",method=\"GET\",code=\"308\",protocol=\"HTTP/1.1\"} 1",
    );
}

#[tokio::test]
async fn redirect_https_answers_every_request() {
    let weir = Conf::new().listener("redirect_https = true").start();
    let mut c = weir.client().await;
    let r = c.get("/a/b?c=d", "www.example.com:8080").await.unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://www.example.com/a/b?c=d")
    );
    let post = c
        .request("POST", "/form", &[("Host", "e.test")], b"x=1")
        .await
        .unwrap();
    assert_eq!(
        (post.status, post.header("location")),
        (308, Some("https://e.test/form"))
    );
    c.send_raw(b"GET /ten HTTP/1.0\r\nHost: old.test\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(r.header("location"), Some("https://old.test/ten"));
    wait_for_line(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"default\",method=\"GET\",code=\"308\",protocol=\"HTTP/1.1\"} 2",
    );
    assert_no_default_responses(&weir);
}

/// Was: the port was dropped (`http://host:8080/x` -> `https://host/x`).
#[tokio::test]
async fn redirect_https_sends_to_the_https_port() {
    let weir = Conf::new()
        .listener("redirect_https = true\nredirect_https_port = 8443")
        .start();
    let mut c = weir.client().await;
    let r = c.get("/a?b", "www.example.com:8080").await.unwrap();
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some("https://www.example.com:8443/a?b"))
    );
    let r = c.get("/v6", "[::1]:8080").await.unwrap();
    assert_eq!(r.header("location"), Some("https://[::1]:8443/v6"));
}

#[tokio::test]
async fn weighted_split_is_exact_per_period() {
    let v1 = Backend::echo("v1");
    let v2 = Backend::echo("v2");
    let weir = Conf::new()
        .listener("keepalive_requests = 0")
        .route_keys(
            "api",
            &[r#"upstreams = [{ name = "v1", weight = 95 }, { name = "v2", weight = 5 }]"#],
        )
        .upstream("v1", &[v1.addr()], &[])
        .upstream("v2", &[v2.addr()], &[])
        .start();
    let mut c = weir.client().await;
    c.set_timeout(Duration::from_secs(10));
    let mut seen = Vec::new();
    for _ in 0..1000 {
        seen.push(backend_of(&mut c, "GET", "/x", &[]).await);
    }
    // One worker: the smooth weighted schedule gives exactly 95:5 per 100 requests, spread out.
    assert_eq!(v1.requests_served(), 950);
    assert_eq!(v2.requests_served(), 50);
    let v2_at: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] == "v2").collect();
    assert!(v2_at.windows(2).all(|w| w[1] - w[0] == 20), "{v2_at:?}");
    wait_for_line(
        &weir,
        "weir_requests_total{listener=\"web\",route=\"api\",method=\"GET\",code=\"200\",protocol=\"HTTP/1.1\"} 1000",
    );
}

/// Was: a canary pool with no usable server kept its share of a split, as 502s: after one
/// failure ejects the canary's only server, its share goes to the stable pool.
#[tokio::test]
async fn a_split_falls_back_while_a_pool_has_no_usable_server() {
    let stable = Backend::echo("stable");
    let dead = common::dead_port();
    let conf = |fallback: &str| {
        Conf::new()
            .listener("keepalive_requests = 0")
            .route_keys(
                "api",
                &[
                    r#"upstreams = [{ name = "stable", weight = 9 }, { name = "canary", weight = 1 }]"#,
                    fallback,
                ],
            )
            .upstream("stable", &[stable.addr()], &[])
            .upstream(
                "canary",
                &[dead.addr],
                &["passive = { max_fails = 1, fail_timeout = \"60s\" }"],
            )
            .start()
    };
    // The statuses of 40 requests (four periods of the 9:1 schedule).
    async fn statuses(weir: &Weir) -> Vec<u16> {
        let mut c = weir.client().await;
        c.set_timeout(Duration::from_secs(10));
        let mut out = Vec::new();
        for _ in 0..40 {
            out.push(c.get("/x", "a.test").await.expect("response").status);
        }
        out
    }
    let weir = conf("");
    let seen = statuses(&weir).await;
    // The first canary pick fails and ejects its server; every later request is served.
    assert_eq!(seen.iter().filter(|s| **s != 200).count(), 1, "{seen:?}");
    let weir = conf("split_fallback = false");
    let seen = statuses(&weir).await;
    assert_eq!(
        seen.iter().filter(|s| **s != 200).count(),
        4,
        "off: {seen:?}"
    );
}

/// `weir check` on a route with `lines` (from line 6), expecting a failure at `line` whose
/// stderr has each of `words`.
fn check_rejects(lines: &str, line: usize, words: &[&str]) {
    let text = format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n[[listeners.routes]]\nname = \"r\"\n\
         {lines}\n[upstreams.a]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
    );
    let dir = TempDir::new("policy-check");
    let path = dir.write("weir.toml", &text);
    let out = weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{lines}: should fail");
    assert!(
        stderr.contains(&format!("{}:{line}:", path.display())),
        "{stderr}"
    );
    for w in words {
        assert!(stderr.contains(w), "{w:?} in {stderr}");
    }
}

#[test]
fn check_rejects_bad_targets_with_a_fix() {
    check_rejects(
        "upstream = \"a\"\nredirect = { to = \"/x\" }",
        7,
        &[
            "routes[0].redirect",
            "both upstream and redirect",
            "(fix: keep one of",
        ],
    );
    check_rejects(
        "redirect = { to = \"/x\", status = 305 }",
        6,
        &[
            "redirect.status",
            "305 is not a redirect status",
            "(fix: use 301 or 308",
        ],
    );
    check_rejects(
        "respond = { status = 700 }",
        6,
        &["respond.status", "between 200 and 599", "(fix: set status"],
    );
    check_rejects(
        "redirect = { to = \"https://{server}{uri}\" }",
        6,
        &["redirect.to", "unknown variable {server}", "{host}"],
    );
    check_rejects(
        "respond = { headers = { \"X Bad\" = \"1\" } }",
        6,
        &[
            "respond.headers",
            "not a valid header name",
            "(fix: use letters",
        ],
    );
    check_rejects(
        "respond = { headers = { \"X-Ok\" = \"line\\nbreak\" } }",
        6,
        &[
            "respond.headers.X-Ok",
            "not a valid header value",
            "without line breaks",
        ],
    );
}

#[tokio::test]
async fn reload_switches_a_route_between_targets() {
    let app = Backend::echo("app");
    let base = Conf::new().upstream("app", &[app.addr()], &[]);
    let weir = base.clone().route("r", "app", &[]).start();
    let mut c = weir.client().await;
    assert_eq!(backend_of(&mut c, "GET", "/x", &[]).await, "app");
    let local = base
        .clone()
        .route_keys("r", &[r#"respond = { status = 200, body = "local" }"#]);
    weir.apply_text(&local.toml()).expect("apply respond");
    let r = c.get("/x", "h").await.unwrap();
    assert_eq!(
        (r.header("x-backend"), r.body_str().as_ref()),
        (None, "local")
    );
    let redirect = base.route_keys("r", &[r#"redirect = { to = "/y{path}", status = 307 }"#]);
    weir.apply_text(&redirect.toml()).expect("apply redirect");
    let r = c.get("/x", "h").await.unwrap();
    assert_eq!((r.status, r.header("location")), (307, Some("/y/x")));
    assert_eq!(app.requests_served(), 1);
}

/// Hosts a backend cutting at the first colon reads as another host than Weir routed.
const AMBIGUOUS_HOSTS: [&str; 4] = [
    "secret.example:80:80",
    "secret.example:abc",
    "[secret.example]",
    "[secret.example]:80",
];

/// Weir denying every client on `secret.example`, a catch-all on `echo` for other hosts.
fn secret_and_catch_all(echo: &Backend) -> Weir {
    Conf::new()
        .route_keys(
            "secret",
            &[
                r#"hosts = ["secret.example"]"#,
                r#"deny = ["0.0.0.0/0", "::/0"]"#,
                r#"respond = { status = 200, body = "secret\n" }"#,
            ],
        )
        .route("any", "echo", &[])
        .upstream("echo", &[echo.addr()], &[])
        .start()
}

/// Was: `Host: secret.example:80:80` (and the others) passed the catch-all's way to a
/// backend reading `secret.example` (attacker review); now 400, as other invalid Hosts,
/// in the Host field, in an absolute-form target and in HTTP/2's `:authority`.
#[tokio::test]
async fn a_host_with_two_ports_or_brackets_around_a_name_is_refused() {
    use weir_testkit::h2_raw::{flag, frame, kind, Block, RawH2};
    let echo = Backend::echo("echo");
    let weir = secret_and_catch_all(&echo);
    for host in AMBIGUOUS_HOSTS {
        for request in [
            format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
            format!("GET http://{host}/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"),
        ] {
            let resp = send_raw_once(weir.addr, request.as_bytes()).await.unwrap();
            assert_eq!(status_of(&resp), Some(400), "{request}");
        }
        let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
        let block = Block::default()
            .indexed(2)
            .indexed(6)
            .literal_indexed_name(4, "/x")
            .literal_indexed_name(1, host);
        let mut out = Vec::new();
        frame(&mut out, kind::SETTINGS, flag::ACK, 0, &[]);
        let end = flag::END_HEADERS | flag::END_STREAM;
        frame(&mut out, kind::HEADERS, end, 1, &block.0);
        raw.send(&out).await.expect("request");
        let answer = raw
            .until(WAIT, |f| {
                let answer = matches!(f.kind, kind::HEADERS | kind::RST_STREAM) && f.stream == 1;
                answer.then(|| (f.kind, f.payload.clone()))
            })
            .await
            .expect("an answer");
        // `:status 400` is the static table's entry 12, which HPACK encoders index; the h2
        // crate resets a stream whose `:authority` is no URI authority (PROTOCOL_ERROR).
        let refused = match &answer {
            (kind::HEADERS, head) => head.first() == Some(&0x8c),
            (_, code) => code[..] == [0, 0, 0, 1],
        };
        assert!(refused, "{host}: {answer:?}");
    }
    assert_eq!(echo.requests_served(), 0);
    let mut c = weir.client().await;
    assert_eq!(c.get("/x", "other.example:8080").await.unwrap().status, 200);
    assert_eq!(c.get("/x", "[::1]:8080").await.unwrap().status, 200);
    assert_eq!(c.get("/x", "secret.example:80").await.unwrap().status, 403);
}
