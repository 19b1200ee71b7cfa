//! Routing (longest prefix, host patterns, the default response) and seed 000's Apache
//! setup (ProxyPass prefix rewrite, ProxyPassReverse on Location / Content-Location / URI).

mod common;

use std::net::SocketAddr;

use common::{forwarded, single, upstream_head, Conf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_testkit::{send_raw_once, Backend};

#[tokio::test]
async fn longest_path_prefix_wins() {
    let root = Backend::echo("root");
    let api = Backend::echo("api");
    let v2 = Backend::echo("v2");
    // Declared shortest first: the order in the file must not matter.
    let weir = Conf::new()
        .route("root", "root", &[r#"path_prefix = "/""#])
        .route("api", "api", &[r#"path_prefix = "/api/""#])
        .route("v2", "v2", &[r#"path_prefix = "/api/v2/""#])
        .upstream("root", &[root.addr()], &[])
        .upstream("api", &[api.addr()], &[])
        .upstream("v2", &[v2.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (path, backend) in [
        ("/api/v2/users", "v2"),
        ("/api/v2/", "v2"),
        ("/api/v1/users", "api"),
        ("/api/v2", "api"),
        ("/api", "root"),
        ("/index.html", "root"),
        ("/", "root"),
    ] {
        let r = c.get(path, "h.test").await.unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("x-backend"), Some(backend), "{path}");
        // Without rewrite_prefix the path reaches the backend unchanged.
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {path} HTTP/1.1"), "h.test", ""),
            "{path}"
        );
    }
    assert_eq!(v2.requests_served(), 2);
    assert_eq!(api.requests_served(), 2);
    assert_eq!(root.requests_served(), 3);
}

#[tokio::test]
async fn host_patterns_exact_suffix_and_any() {
    let exact = Backend::echo("exact");
    let suffix = Backend::echo("suffix");
    let any = Backend::echo("any");
    let weir = Conf::new()
        .route("any", "any", &[r#"hosts = ["*"]"#])
        .route("suffix", "suffix", &[r#"hosts = ["*.example.com"]"#])
        .route(
            "exact",
            "exact",
            &[r#"hosts = ["a.example.com", "other.test"]"#],
        )
        .upstream("any", &[any.addr()], &[])
        .upstream("suffix", &[suffix.addr()], &[])
        .upstream("exact", &[exact.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (host, backend) in [
        ("a.example.com", "exact"),
        ("A.Example.COM", "exact"),
        ("a.example.com:8080", "exact"),
        // The absolute (FQDN) form names the same host.
        ("a.example.com.", "exact"),
        ("A.EXAMPLE.COM.:8080", "exact"),
        ("b.example.com.", "suffix"),
        ("other.test", "exact"),
        ("b.example.com", "suffix"),
        ("deep.b.example.com:81", "suffix"),
        // "*.example.com" does not match the bare domain.
        ("example.com", "any"),
        ("example.org", "any"),
        ("127.0.0.1", "any"),
    ] {
        let r = c.get("/x", host).await.unwrap();
        assert_eq!(r.status, 200, "{host}");
        assert_eq!(r.header("x-backend"), Some(backend), "{host}");
        // The client's Host (with its port and case) is what the backend sees.
        assert!(
            r.body_str()
                .starts_with(&format!("GET /x HTTP/1.1\r\nHost: {host}\r\n")),
            "{host}: {}",
            r.body_str()
        );
    }
}

/// A route written for a host takes its requests before a `*` route with a longer prefix
/// (as nginx picks the server by name first): `/static/` must not skip the host's own
/// route, its `deny` included; other hosts still reach `/static/`.
#[tokio::test]
async fn a_host_route_comes_before_a_longer_prefix_of_any_host() {
    let secret = Backend::echo("secret");
    let shared = Backend::echo("static");
    let weir = Conf::new()
        .route("static", "static", &[r#"path_prefix = "/static/""#])
        .route("secret", "secret", &[r#"hosts = ["secret.test"]"#])
        .route(
            "secret-admin",
            "secret",
            &[
                r#"hosts = ["secret.test"]"#,
                r#"path_prefix = "/admin/""#,
                r#"deny = ["0.0.0.0/0"]"#,
            ],
        )
        .upstream("static", &[shared.addr()], &[])
        .upstream("secret", &[secret.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let r = c.get("/static/x", "secret.test").await.unwrap();
    assert_eq!(r.header("x-backend"), Some("secret"));
    let r = c.get("/static/x", "other.test").await.unwrap();
    assert_eq!(r.header("x-backend"), Some("static"));
    let r = c.get("/admin/x", "secret.test").await.unwrap();
    assert_eq!(r.status, 403, "the host's deny holds");
    assert_eq!(shared.requests_served(), 1);
}

#[tokio::test]
async fn absolute_form_target_routes_by_its_authority() {
    let a = Backend::echo("a");
    let any = Backend::echo("any");
    let weir = Conf::new()
        .route("a", "a", &[r#"hosts = ["a.test"]"#])
        .route("any", "any", &[])
        .upstream("a", &[a.addr()], &[])
        .upstream("any", &[any.addr()], &[])
        .start();
    let mut c = weir.client().await;
    c.send_raw(b"GET http://a.test/p?q=1 HTTP/1.1\r\nHost: b.test\r\n\r\n")
        .await
        .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("a"));
    // The upstream gets origin form.
    assert!(
        r.body_str().starts_with("GET /p?q=1 HTTP/1.1\r\n"),
        "{}",
        r.body_str()
    );
}

#[tokio::test]
async fn unmatched_request_gets_the_default_response_and_keeps_the_connection() {
    let b = Backend::echo("only");
    let weir = Conf::new()
        .listener(r#"default_response = { status = 404, body = "nothing here\n" }"#)
        .route(
            "only",
            "up",
            &[r#"hosts = ["only.test"]"#, r#"path_prefix = "/app/""#],
        )
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (path, host) in [("/app/x", "other.test"), ("/elsewhere", "only.test")] {
        let r = c.get(path, host).await.unwrap();
        assert_eq!(r.status, 404, "{path} {host}");
        assert_eq!(r.body_str(), "nothing here\n");
        assert_eq!(r.header("content-type"), Some("text/plain"));
        assert_eq!(r.header("content-length"), Some("13"));
        assert_eq!(r.header("connection"), None, "keep-alive is preserved");
    }
    // The same connection still routes.
    let r = c.get("/app/x", "only.test").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("only"));
    assert_eq!(
        b.requests_served(),
        1,
        "unrouted requests never reach a backend"
    );
}

#[tokio::test]
async fn default_response_status_and_content_type_come_from_the_config() {
    let weir = Conf::new()
        .listener(
            r#"default_response = { status = 503, body = "<p>down</p>", content_type = "text/html" }"#,
        )
        .start();
    let mut c = weir.client().await;
    let r = c.get("/", "h").await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body_str(), "<p>down</p>");
    assert_eq!(r.header("content-type"), Some("text/html"));
    let r = c.get("/again", "h").await.unwrap();
    assert_eq!(r.status, 503);
}

#[tokio::test]
async fn default_response_to_a_post_with_a_body_keeps_the_connection_usable() {
    let b = Backend::echo("app");
    let weir = Conf::new()
        .route("app", "up", &[r#"path_prefix = "/app/""#])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    // Content-Length body: the body bytes must not be read as the next request.
    let r = c
        .request(
            "POST",
            "/nowhere",
            &[],
            b"GET /app/smuggled HTTP/1.1\r\n\r\n",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body_str(), "no route\n");
    // Chunked body.
    let body = weir_testkit::chunked::encode(&[b"hello", b" world"], &[]);
    let r = c
        .request(
            "POST",
            "/nowhere",
            &[("Transfer-Encoding", "chunked")],
            &body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    let r = c.get("/app/next", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        upstream_head("GET /app/next HTTP/1.1", "h", "")
    );
    assert_eq!(b.requests_served(), 1, "the POST bodies were not forwarded");
}

/// Seed 000: `ProxyPass /cgi/ http://backend/`.
#[tokio::test]
async fn cgi_prefix_is_rewritten_for_the_backend() {
    let b = Backend::echo("cgi");
    let weir = Conf::new()
        .route(
            "cgi",
            "cgi",
            &[
                r#"path_prefix = "/cgi/""#,
                r#"rewrite_prefix = "/""#,
                "reverse_rewrite = true",
            ],
        )
        .upstream("cgi", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    for (public, upstream) in [
        ("/cgi/cgi-bin/second.pl", "/cgi-bin/second.pl"),
        (
            "/cgi/cgi-bin/first.pl?a=1&b=%20",
            "/cgi-bin/first.pl?a=1&b=%20",
        ),
        ("/cgi/", "/"),
    ] {
        let r = c.get(public, "www.test:8080").await.unwrap();
        assert_eq!(r.status, 200, "{public}");
        assert_eq!(
            r.body_str(),
            upstream_head(&format!("GET {upstream} HTTP/1.1"), "www.test:8080", ""),
            "{public}"
        );
    }
    // "/cgi" (no slash) does not match the route.
    let r = c.get("/cgi", "www.test:8080").await.unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn rewrite_to_a_deeper_prefix() {
    let b = Backend::echo("api");
    let weir = Conf::new()
        .route(
            "api",
            "api",
            &[
                r#"path_prefix = "/api/""#,
                r#"rewrite_prefix = "/backend/v1/""#,
            ],
        )
        .upstream("api", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let r = c.get("/api/users?id=7", "h").await.unwrap();
    assert_eq!(
        r.body_str(),
        upstream_head("GET /backend/v1/users?id=7 HTTP/1.1", "h", "")
    );
}

/// A tiny keep-alive backend on the test runtime whose response headers may name its own
/// address (which a `Backend::fixed` cannot know before it starts). Bodyless requests only.
async fn self_naming_backend(
    status_line: &'static str,
    headers: impl Fn(SocketAddr) -> String + Send + 'static,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let response = format!(
        "{status_line}\r\n{}Content-Length: 0\r\n\r\n",
        headers(addr)
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if stream.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Seed 000: `ProxyPassReverse /cgi/ http://backend/`.
#[tokio::test]
async fn location_headers_are_mapped_back_to_the_public_prefix() {
    let own = self_naming_backend("HTTP/1.1 302 Found", |addr| {
        format!(
            "Location: http://{addr}/login?next=%2F\r\n\
             Content-Location: /y/index.html\r\n\
             URI: http://{addr}/z\r\n\
             X-Other: http://{addr}/untouched\r\n"
        )
    })
    .await;
    let foreign = Backend::fixed(
        301,
        &[
            ("Location", "http://other.example/x"),
            ("Content-Location", "relative/y"),
            ("URI", "https://www.test:8080/secure"),
        ],
        "",
    );
    let plain = self_naming_backend("HTTP/1.1 302 Found", |addr| {
        format!("Location: http://{addr}/y\r\nContent-Location: /y\r\n")
    })
    .await;
    let weir = Conf::new()
        .route(
            "cgi",
            "cgi",
            &[
                r#"path_prefix = "/cgi/""#,
                r#"rewrite_prefix = "/""#,
                "reverse_rewrite = true",
            ],
        )
        .route(
            "ext",
            "ext",
            &[
                r#"path_prefix = "/ext/""#,
                r#"rewrite_prefix = "/""#,
                "reverse_rewrite = true",
            ],
        )
        .route("plain", "plain", &[r#"path_prefix = "/plain/""#])
        .upstream("cgi", &[own], &[])
        .upstream("ext", &[foreign.addr()], &[])
        .upstream("plain", &[plain], &[])
        .start();
    let mut c = weir.client().await;

    let r = c
        .get("/cgi/cgi-bin/first.pl", "www.test:8080")
        .await
        .unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some("http://www.test:8080/cgi/login?next=%2F")
    );
    assert_eq!(r.header("content-location"), Some("/cgi/y/index.html"));
    assert_eq!(r.header("uri"), Some("http://www.test:8080/cgi/z"));
    // Only the three location headers are mapped.
    assert_eq!(
        r.header("x-other"),
        Some(&*format!("http://{own}/untouched"))
    );

    // Foreign or relative values pass unchanged.
    let r = c.get("/ext/a", "www.test:8080").await.unwrap();
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("http://other.example/x"));
    assert_eq!(r.header("content-location"), Some("relative/y"));
    assert_eq!(r.header("uri"), Some("https://www.test:8080/secure"));

    // Without reverse_rewrite nothing is mapped.
    let r = c.get("/plain/a", "www.test:8080").await.unwrap();
    assert_eq!(r.header("location"), Some(&*format!("http://{plain}/y")));
    assert_eq!(r.header("content-location"), Some("/y"));
}

/// The client sent no Host (HTTP/1.0): an upstream URL maps to the upstream's authority.
#[tokio::test]
async fn location_mapping_without_a_client_host() {
    let own = self_naming_backend("HTTP/1.1 302 Found", |addr| {
        format!("Location: http://{addr}/next\r\n")
    })
    .await;
    let weir = Conf::new()
        .route(
            "cgi",
            "cgi",
            &[
                r#"path_prefix = "/cgi/""#,
                r#"rewrite_prefix = "/""#,
                "reverse_rewrite = true",
            ],
        )
        .upstream("cgi", &[own], &[])
        .start();
    let raw = send_raw_once(weir.addr, b"GET /cgi/a HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = common::split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 302 "), "{head}");
    assert!(
        head.contains(&format!("\r\nLocation: http://{own}/cgi/next\r\n")),
        "{head}"
    );
}

#[tokio::test]
async fn forwarded_headers_are_appended_after_end_to_end_headers() {
    let b = Backend::echo("e");
    let weir = single(b.addr()).start();
    let r = send_raw_once(
        weir.addr,
        b"GET /f HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&r);
    assert!(
        text.ends_with(&format!(
            "\r\n\r\nGET /f HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n{}\r\n",
            forwarded("h")
        )),
        "{text}"
    );
}
