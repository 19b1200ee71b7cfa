//! Seed 003's nginx setup (Host preserved or replaced, X-Real-IP, X-Forwarded-*), and
//! hop-by-hop header removal in both directions with everything else byte for byte.

mod common;

use common::{forwarded, single, split_head, upstream_head, Conf};
use weir_testkit::{send_raw_once, Backend};

fn nginx_like(backend: std::net::SocketAddr, preserve_host: bool) -> Conf {
    Conf::new()
        .route(
            "app",
            "app",
            &[
                r#"path_prefix = "/app/""#,
                &format!("preserve_host = {preserve_host}"),
            ],
        )
        .upstream("app", &[backend], &[])
}

#[tokio::test]
async fn preserve_host_true_keeps_the_client_host() {
    let b = Backend::echo("app");
    let weir = nginx_like(b.addr(), true).start();
    let mut c = weir.client().await;
    let r = c.get("/app/page", "public.example:8443").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        "GET /app/page HTTP/1.1\r\nHost: public.example:8443\r\n\
         X-Real-IP: 127.0.0.1\r\nX-Forwarded-For: 127.0.0.1\r\n\
         X-Forwarded-Proto: http\r\nX-Forwarded-Host: public.example:8443\r\n\r\n"
    );
}

#[tokio::test]
async fn preserve_host_false_sends_the_server_address() {
    let b = Backend::echo("app");
    let weir = nginx_like(b.addr(), false).start();
    let mut c = weir.client().await;
    let r = c.get("/app/page", "public.example").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        format!(
            "GET /app/page HTTP/1.1\r\nHost: {}\r\n{}\r\n",
            b.addr(),
            forwarded("public.example")
        )
    );
}

#[tokio::test]
async fn x_forwarded_for_is_appended_to_the_clients_chain() {
    let b = Backend::echo("app");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c
        .request(
            "GET",
            "/",
            &[("Host", "h"), ("X-Forwarded-For", "203.0.113.9")],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(
        r.body_str(),
        "GET / HTTP/1.1\r\nHost: h\r\nX-Real-IP: 127.0.0.1\r\n\
         X-Forwarded-For: 203.0.113.9, 127.0.0.1\r\n\
         X-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n\r\n"
    );
    // Several X-Forwarded-For fields (and a list in one) become one field, in order.
    let r = c
        .request(
            "GET",
            "/",
            &[
                ("Host", "h"),
                ("X-Forwarded-For", "198.51.100.1, 198.51.100.2"),
                ("X-Other", "o"),
                ("x-forwarded-for", "198.51.100.3"),
            ],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(
        r.body_str(),
        "GET / HTTP/1.1\r\nHost: h\r\nX-Other: o\r\nX-Real-IP: 127.0.0.1\r\n\
         X-Forwarded-For: 198.51.100.1, 198.51.100.2, 198.51.100.3, 127.0.0.1\r\n\
         X-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n\r\n"
    );
}

#[tokio::test]
async fn client_sent_forwarded_headers_are_replaced_not_duplicated() {
    let b = Backend::echo("app");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    let r = c
        .request(
            "GET",
            "/",
            &[
                ("Host", "real.test"),
                ("X-Real-IP", "6.6.6.6"),
                ("X-Forwarded-Proto", "https"),
                ("X-Forwarded-Host", "spoofed.test"),
                ("X-Keep", "k"),
            ],
            b"",
        )
        .await
        .unwrap();
    let body = r.body_str();
    assert_eq!(
        body,
        upstream_head("GET / HTTP/1.1", "real.test", "X-Keep: k\r\n")
    );
    assert_eq!(body.matches("X-Real-IP").count(), 1, "{body}");
    assert!(
        !body.contains("6.6.6.6") && !body.contains("spoofed"),
        "{body}"
    );
}

/// A client's forwarded headers spelt with `_` (`X_Real_IP`) never pass either, over
/// HTTP/1.1 or HTTP/2: a CGI-style server (PHP, WSGI) reads them as the real ones, and the
/// client's value would come first.
#[tokio::test]
async fn forwarded_headers_in_cgi_spelling_are_dropped_too() {
    let b = Backend::echo("app");
    let weir = single(b.addr()).start();
    let spoofs = [
        ("X_Real_IP", "6.6.6.6"),
        ("x_forwarded_for", "6.6.6.7"),
        ("X_Forwarded_Proto", "https"),
        ("X_Forwarded-Host", "spoofed.test"),
        ("X_Keep", "k"),
    ];
    let mut c = weir.client().await;
    let mut asked = vec![("Host", "real.test")];
    asked.extend_from_slice(&spoofs);
    let r = c.request("GET", "/", &asked, b"").await.unwrap();
    let mut h2 = common::h2c_client(weir.addr).await;
    let (_, _, h2_body) = common::h2_get(&mut h2, "/", &spoofs).await;
    for (what, body) in [
        ("HTTP/1.1", r.body_str()),
        ("HTTP/2", String::from_utf8_lossy(&h2_body)),
    ] {
        assert!(
            !body.contains("6.6.6") && !body.contains("spoofed"),
            "{what}: {body}"
        );
        assert!(!body.contains("https"), "{what}: {body}");
        assert!(
            body.to_ascii_lowercase().contains("x_keep: k"),
            "{what}: {body}"
        );
    }
}

#[tokio::test]
async fn forwarded_headers_false_adds_none_and_passes_the_clients_own() {
    let b = Backend::echo("app");
    let weir = Conf::new()
        .route("app", "app", &["forwarded_headers = false"])
        .upstream("app", &[b.addr()], &[])
        .start();
    let mut c = weir.client().await;
    let r = c.get("/plain", "h").await.unwrap();
    assert_eq!(r.body_str(), "GET /plain HTTP/1.1\r\nHost: h\r\n\r\n");
    let r = c
        .request(
            "GET",
            "/own",
            &[
                ("Host", "h"),
                ("X-Forwarded-For", "1.2.3.4"),
                ("X-Real-IP", "1.2.3.4"),
            ],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(
        r.body_str(),
        "GET /own HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4\r\nX-Real-IP: 1.2.3.4\r\n\r\n"
    );
}

#[tokio::test]
async fn http10_request_without_host_gets_no_forwarded_host() {
    let b = Backend::echo("app");
    let weir = Conf::new()
        .route("app", "app", &["preserve_host = true"])
        .upstream("app", &[b.addr()], &[])
        .start();
    let raw = send_raw_once(weir.addr, b"GET /old HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    // No client Host: the upstream gets the server's address as Host (HTTP/1.1 needs one).
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            "GET /old HTTP/1.1\r\nHost: {}\r\nX-Real-IP: 127.0.0.1\r\n\
             X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
            b.addr()
        )
    );
}

#[tokio::test]
async fn hop_by_hop_request_headers_never_reach_the_backend() {
    let b = Backend::echo("app");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(
        b"GET /hop HTTP/1.1\r\n\
          Host: h\r\n\
          X-First: 1\r\n\
          Connection: keep-alive, X-Foo\r\n\
          X-Foo: secret\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Connection: keep-alive\r\n\
          TE: trailers\r\n\
          Trailer: X-T\r\n\
          Upgrade: h2c\r\n\
          x-MiXed-CASE: Value  with\tinner  space\r\n\
          X-Dup: a\r\n\
          Accept: */*\r\n\
          X-Dup: b\r\n\
          connection: x-bar\r\n\
          X-BAR: also secret\r\n\
          X-Last: z\r\n\r\n",
    )
    .await
    .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        upstream_head(
            "GET /hop HTTP/1.1",
            "h",
            "X-First: 1\r\nx-MiXed-CASE: Value  with\tinner  space\r\nX-Dup: a\r\n\
             Accept: */*\r\nX-Dup: b\r\nX-Last: z\r\n"
        )
    );
    // The connection is still keep-alive: the removed Connection header was not obeyed as
    // an upstream instruction, and the client connection stays usable.
    let r = c.get("/next", "h").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(b.connections_accepted(), 1);
}

#[tokio::test]
async fn every_header_named_by_connection_is_removed() {
    let b = Backend::echo("app");
    let weir = single(b.addr()).start();
    let mut c = weir.client().await;
    c.send_raw(
        b"GET / HTTP/1.1\r\nHost: h\r\n\
          Connection: o1, o2, o3, o4, o5, o6, o7, o8, X-Secret\r\n\
          X-Secret: must not pass\r\n\r\n",
    )
    .await
    .unwrap();
    let r = c.read_response(false).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), upstream_head("GET / HTTP/1.1", "h", ""));
}

#[tokio::test]
async fn hop_by_hop_response_headers_never_reach_the_client() {
    let b = Backend::raw_response(
        b"HTTP/1.1 200 OK\r\n\
          X-First: 1\r\n\
          Connection: X-Secret, keep-alive\r\n\
          X-Secret: s\r\n\
          Keep-Alive: timeout=5, max=100\r\n\
          Proxy-Connection: keep-alive\r\n\
          TE: trailers\r\n\
          Trailer: X-T\r\n\
          Upgrade: h2c\r\n\
          x-CaSe-MiXed: V  v\r\n\
          Set-Cookie: a=1\r\n\
          Content-Length: 2\r\n\
          Set-Cookie: b=2\r\n\
          X-Last: z\r\n\r\nok",
    );
    let weir = single(b.addr()).start();
    let raw = send_raw_once(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw),
        "HTTP/1.1 200 OK\r\n\
         X-First: 1\r\n\
         x-CaSe-MiXed: V  v\r\n\
         Set-Cookie: a=1\r\n\
         Content-Length: 2\r\n\
         Set-Cookie: b=2\r\n\
         X-Last: z\r\n\
         Connection: close\r\n\r\nok"
    );
}

#[tokio::test]
async fn response_reason_phrase_and_unknown_status_pass_through() {
    let b = Backend::raw_response(
        b"HTTP/1.1 299 Quite Fine Indeed\r\nContent-Length: 0\r\nX-A: b\r\n\r\n",
    );
    let weir = single(b.addr()).start();
    let raw = send_raw_once(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw),
        "HTTP/1.1 299 Quite Fine Indeed\r\nContent-Length: 0\r\nX-A: b\r\nConnection: close\r\n\r\n"
    );
}
