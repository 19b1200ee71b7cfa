//! The HTTP cache (a route's `cache`, `[caches.NAME]`) over real sockets: fresh hits
//! answered with no upstream request, what is never stored (`no-store`, `private`,
//! `Set-Cookie`, `Authorization`, a body over `max_object_size`), `s-maxage`, heuristic
//! freshness, `Vary` with `Accept-Encoding` normalised, HEAD from a cached GET, chunked
//! bodies, `Cache-Status`, and an HTTP/2 client served from the same entries.

mod common;

use std::net::SocketAddr;

use common::{h2_get, Conf, DiskDir};
use weir_testkit::{Backend, Client, Response};

/// Route `c` on `/` caching in store `mem` (`route_keys`: more keys of the route's
/// `cache`), to `backend`.
fn cached(backend: SocketAddr, route_keys: &str, store_keys: &str) -> Conf {
    cached_in(
        backend,
        route_keys,
        &format!("kind = \"memory\"\n{store_keys}"),
    )
}

/// [`cached`] with the store's whole table given (`store`).
fn cached_in(backend: SocketAddr, route_keys: &str, store: &str) -> Conf {
    Conf::new()
        .route(
            "c",
            "up",
            &[&format!("cache = {{ store = \"mem\"{route_keys} }}")],
        )
        .upstream("up", &[backend], &[])
        .table(&format!("[caches.mem]\n{store}"))
}

/// A header-matched `beta` route and the `prod` catch-all, both with the route keys
/// `store` on one memory store: routes that share a store, never an entry.
fn beta_and_prod(store: &str, beta: SocketAddr, prod: SocketAddr) -> Conf {
    Conf::new()
        .route(
            "beta",
            "beta",
            &[r#"match_headers = { "X-Beta" = "1" }"#, store],
        )
        .route("c", "prod", &[store])
        .upstream("beta", &[beta], &[])
        .upstream("prod", &[prod], &[])
        .table("[caches.mem]\nkind = \"memory\"")
}

impl DiskDir {
    /// The store's table: on disk in this directory.
    fn store(&self) -> String {
        let path = self.0.display();
        format!("kind = \"disk\"\npath = \"{path}\"\nmax_size = \"16MiB\"")
    }
}

/// A response's header fields and the request's.
type Case = (
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str)],
);

async fn get(c: &mut Client, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut all = vec![("Host", "example.com")];
    all.extend_from_slice(headers);
    c.request("GET", path, &all, b"").await.expect("response")
}

#[tokio::test]
async fn a_fresh_entry_is_served_without_asking_the_upstream() {
    let b = Backend::fixed(
        200,
        &[("Cache-Control", "max-age=60"), ("X-Up", "1")],
        "hello",
    );
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/a?x=1", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"hello");
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    for _ in 0..3 {
        let hit = get(&mut c, "/a?x=1", &[]).await;
        assert_eq!(hit.status, 200);
        assert_eq!(hit.body, b"hello");
        assert_eq!(hit.header("X-Up"), Some("1"));
        assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
        assert_eq!(hit.header("Content-Length"), Some("5"));
        assert!(hit.header("Age").is_some(), "a hit says its age");
    }
    assert_eq!(b.requests_served(), 1, "hits never reach the upstream");
    // Another query, another host: other keys.
    get(&mut c, "/a?x=2", &[]).await;
    let other = c
        .request("GET", "/a?x=1", &[("Host", "other.example")], b"")
        .await
        .unwrap();
    assert_eq!(other.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    assert_eq!(b.requests_served(), 3);
    // A new connection gets the same entry.
    let mut c2 = weir.client().await;
    assert_eq!(
        get(&mut c2, "/a?x=1", &[]).await.header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(b.requests_served(), 3);
}

/// Was: a freshness past what `SystemTime` can add (Java's `Long.MAX_VALUE` "never expires")
/// panicked storing the entry, and a release build aborted the whole process (attacker
/// review). Now it is stored, fresh for a long time.
#[tokio::test]
async fn a_freshness_of_forever_is_stored_not_a_crash() {
    for lifetime in [
        "max-age=9223372036854775807",
        "public, s-maxage=18446744073709551615",
    ] {
        let b = Backend::fixed(200, &[("Cache-Control", lifetime)], "kept");
        let weir = cached(b.addr(), "", "").start();
        let first = get(&mut weir.client().await, "/f", &[]).await;
        assert_eq!(first.body, b"kept", "{lifetime}");
        let hit = get(&mut weir.client().await, "/f", &[]).await;
        assert_eq!(hit.header("Cache-Status"), Some("weir; hit"), "{lifetime}");
        assert_eq!(b.requests_served(), 1, "{lifetime}");
    }
}

/// Was: an upstream's `Age: 18446744073709551615` was stored as it came, and the cache
/// policy's age (that plus the time stored) overflowed a second later: a release build
/// aborted, and a disk store aborted again at every start (attacker review). An `Age` is
/// now capped at 2^31 seconds (RFC 9111 1.2.2), which a hit shows.
#[tokio::test]
async fn an_age_past_2_to_the_31_seconds_is_capped() {
    let headers = [
        ("Cache-Control", "max-age=9223372036854775807"),
        ("Age", "18446744073709551615"),
    ];
    let b = Backend::fixed(200, &headers, "old");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"old");
    let hit = get(&mut c, "/", &[]).await;
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    let age: u64 = hit.header("Age").expect("an Age").parse().unwrap();
    assert!((1 << 31..(1 << 31) + 60).contains(&age), "Age {age}");
    assert_eq!(b.requests_served(), 1);
}

#[tokio::test]
async fn head_is_answered_from_a_cached_get() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "0123456789");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let head = c
        .request("HEAD", "/", &[("Host", "example.com")], b"")
        .await
        .expect("HEAD response");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("Content-Length"), Some("10"));
    assert_eq!(head.header("Cache-Status"), Some("weir; hit"));
    assert!(head.body.is_empty());
    // The connection is still in step: the next response is read whole.
    assert_eq!(get(&mut c, "/", &[]).await.body, b"0123456789");
    assert_eq!(b.requests_served(), 1);
}

/// Each of these responses (or requests) must reach the upstream every time.
#[tokio::test]
async fn what_a_shared_cache_must_not_store_is_fetched_every_time() {
    let cases: [Case; 7] = [
        (&[("Cache-Control", "no-store, max-age=60")], &[]),
        (&[("Cache-Control", "private, max-age=60")], &[]),
        // Directive names are case-insensitive (RFC 9111 5.2): classic ASP sends
        // `Private`. Was: stored and served to every client (attacker review).
        (&[("Cache-Control", "Private, max-age=60")], &[]),
        (&[("Cache-Control", "max-age=60, NO-STORE")], &[]),
        (
            &[("Cache-Control", "max-age=60"), ("Set-Cookie", "a=b")],
            &[],
        ),
        (
            &[("Cache-Control", "max-age=60")],
            &[("Authorization", "Basic YTpi")],
        ),
        (&[("Cache-Control", "max-age=0")], &[]),
    ];
    for (response, request) in cases {
        let b = Backend::fixed(200, response, "body");
        let weir = cached(b.addr(), "", "").start();
        let mut c = weir.client().await;
        for _ in 0..3 {
            let r = get(&mut c, "/", request).await;
            assert_eq!(r.body, b"body", "{response:?} {request:?}");
            assert_eq!(r.header("Cache-Status"), Some("weir; fwd=uri-miss"));
        }
        assert_eq!(b.requests_served(), 3, "{response:?} {request:?}");
    }
}

#[tokio::test]
async fn s_maxage_public_with_authorization_and_heuristic_freshness_are_stored() {
    let cases: [Case; 3] = [
        // s-maxage wins over max-age=0 for a shared cache, and allows Authorization.
        (
            &[("Cache-Control", "max-age=0, s-maxage=60")],
            &[("Authorization", "Basic YTpi")],
        ),
        // No explicit freshness: a tenth of the time since Last-Modified.
        (&[("Last-Modified", "Mon, 01 Jan 2001 00:00:00 GMT")], &[]),
        (&[("Expires", "Thu, 01 Jan 2099 00:00:00 GMT")], &[]),
    ];
    for (response, request) in cases {
        let b = Backend::fixed(200, response, "body");
        let weir = cached(b.addr(), "", "").start();
        let mut c = weir.client().await;
        get(&mut c, "/", request).await;
        let r = get(&mut c, "/", request).await;
        assert_eq!(r.header("Cache-Status"), Some("weir; hit"), "{response:?}");
        assert_eq!(r.body, b"body");
        assert_eq!(b.requests_served(), 1, "{response:?}");
    }
}

#[tokio::test]
async fn vary_accept_encoding_keeps_one_variant_per_normalised_coding() {
    let headers = [("Cache-Control", "max-age=60"), ("Vary", "Accept-Encoding")];
    let b = Backend::fixed(200, &headers, "v");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    let ae = |v| [("Accept-Encoding", v)];
    get(&mut c, "/", &ae("gzip")).await;
    assert_eq!(b.requests_served(), 1);
    // Spelled differently, the same coding Weir would pick: the same variant.
    for same in ["gzip, deflate", "deflate;q=0.5, gzip"] {
        let r = get(&mut c, "/", &ae(same)).await;
        assert_eq!(r.header("Cache-Status"), Some("weir; hit"), "{same}");
    }
    assert_eq!(b.requests_served(), 1);
    get(&mut c, "/", &ae("br, gzip")).await;
    get(&mut c, "/", &[]).await;
    assert_eq!(
        b.requests_served(),
        3,
        "br and identity are variants of their own"
    );
    assert_eq!(
        get(&mut c, "/", &ae("gzip")).await.header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(
        get(&mut c, "/", &ae("br")).await.header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(
        get(&mut c, "/", &[]).await.header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(b.requests_served(), 3);
}

#[tokio::test]
async fn a_body_over_max_object_size_streams_through_uncached() {
    let big = "x".repeat(200_000);
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], &big);
    let weir = cached(b.addr(), "", "max_object_size = \"100KiB\"").start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        let r = get(&mut c, "/", &[]).await;
        assert_eq!(r.body.len(), big.len());
        assert_eq!(r.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    }
    assert_eq!(b.requests_served(), 2);
}

#[tokio::test]
async fn a_chunked_response_is_stored_decoded_and_served_with_a_length() {
    let raw = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let b = Backend::raw_response(raw);
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/", &[]).await;
    assert_eq!(first.body, b"hello world");
    let mut c = weir.client().await;
    let hit = get(&mut c, "/", &[]).await;
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(hit.header("Content-Length"), Some("11"));
    assert_eq!(hit.header("Transfer-Encoding"), None);
    assert_eq!(hit.body, b"hello world");
    assert_eq!(b.requests_served(), 1);
}

#[tokio::test]
async fn cache_status_can_be_switched_off_and_other_methods_bypass() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "p");
    let weir = cached(b.addr(), ", status_header = false", "").start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        let r = get(&mut c, "/", &[]).await;
        assert_eq!(r.header("Cache-Status"), None);
    }
    assert_eq!(b.requests_served(), 1);
    for _ in 0..2 {
        let r = c
            .request("POST", "/", &[("Host", "example.com")], b"data")
            .await
            .unwrap();
        assert_eq!(r.body, b"p");
    }
    assert_eq!(
        b.requests_served(),
        3,
        "POST is never answered from the cache"
    );
}

#[tokio::test]
async fn an_http2_client_is_served_from_the_same_entry() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "shared");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/h2", &[]).await;
    let mut h2 = common::h2c_client(weir.addr).await;
    let request = http::Request::get("http://example.com/h2")
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.expect("h2 response");
    assert_eq!(response.status(), 200);
    let status = response.headers().get("cache-status").unwrap();
    assert_eq!(status, "weir; hit");
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(data) = body.data().await {
        got.extend_from_slice(&data.unwrap());
    }
    assert_eq!(got, b"shared");
    // A range of the entry, from the store too.
    let request = http::Request::get("http://example.com/h2")
        .header("range", "bytes=1-3")
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.expect("h2 response");
    assert_eq!(response.status(), 206);
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(data) = body.data().await {
        got.extend_from_slice(&data.unwrap());
    }
    assert_eq!(got, b"har");
    assert_eq!(b.requests_served(), 1);
}

/// Route `c` on `/` caching in memory store `mem`, to `backend`, with more route lines
/// (`lines`: its filters).
fn cached_route(backend: SocketAddr, lines: &[&str]) -> Conf {
    let mut keys = vec!["cache = { store = \"mem\" }"];
    keys.extend_from_slice(lines);
    Conf::new()
        .route("c", "up", &keys)
        .upstream("up", &[backend], &[])
        .table("[caches.mem]\nkind = \"memory\"")
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut plain)
        .expect("gzip");
    plain
}

/// A hit is sent as a fetched response is: the route's `response_headers` and its
/// compression apply to it, for a client that takes gzip and one that does not.
#[tokio::test]
async fn a_hit_gets_the_routes_response_headers_and_compression() {
    let text = "cacheable text ".repeat(200);
    let fields = [
        ("Cache-Control", "max-age=60"),
        ("Content-Type", "text/plain"),
        ("X-Up", "1"),
    ];
    let b = Backend::fixed(200, &fields, &text);
    let rules = r#"response_headers = { set = { "X-Served-By" = "weir" }, remove = ["X-Up"] }"#;
    let compression = r#"compression = { algorithms = ["gzip"], types = ["text/*"] }"#;
    let weir = cached_route(b.addr(), &[rules, compression]).start();
    let mut c = weir.client().await;
    for expected in ["weir; fwd=uri-miss", "weir; hit", "weir; hit"] {
        let r = get(&mut c, "/t", &[("Accept-Encoding", "gzip")]).await;
        assert_eq!(r.header("Cache-Status"), Some(expected));
        assert_eq!(r.header("X-Served-By"), Some("weir"), "{expected}");
        assert_eq!(r.header("X-Up"), None, "{expected}");
        assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{expected}");
        assert_eq!(gunzip(&r.body), text.as_bytes(), "{expected}");
    }
    let plain = get(&mut c, "/t", &[]).await;
    assert_eq!(plain.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(plain.header("Content-Encoding"), None);
    assert_eq!(plain.header("X-Served-By"), Some("weir"));
    assert_eq!(plain.body, text.as_bytes());
    assert_eq!(b.requests_served(), 1, "hits never reach the upstream");
}

/// A `Range` on a hit is answered from the stored body: one range (206), several
/// (`multipart/byteranges`), none satisfiable (416), and `If-Range` that does not hold
/// (the whole 200).
#[tokio::test]
async fn a_hit_answers_ranges_from_the_stored_body() {
    let fields = [
        ("Cache-Control", "max-age=60"),
        ("Content-Type", "text/plain"),
        ("ETag", "\"r1\""),
    ];
    let b = Backend::fixed(200, &fields, "0123456789");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let one = get(&mut c, "/", &[("Range", "bytes=2-4")]).await;
    assert_eq!(one.status, 206);
    assert_eq!(one.body, b"234");
    assert_eq!(one.header("Content-Range"), Some("bytes 2-4/10"));
    assert_eq!(one.header("Cache-Status"), Some("weir; hit"));
    let two = get(&mut c, "/", &[("Range", "bytes=0-0,-2")]).await;
    assert_eq!(two.status, 206);
    let kind = two.header("Content-Type").unwrap_or_default();
    assert!(
        kind.starts_with("multipart/byteranges; boundary="),
        "{kind}"
    );
    let body = String::from_utf8_lossy(&two.body);
    assert!(
        body.contains("Content-Range: bytes 0-0/10\r\n\r\n0\r\n"),
        "{body}"
    );
    assert!(
        body.contains("Content-Range: bytes 8-9/10\r\n\r\n89\r\n"),
        "{body}"
    );
    assert!(body.contains("Content-Type: text/plain\r\n"), "{body}");
    let none = get(&mut c, "/", &[("Range", "bytes=20-")]).await;
    assert_eq!(none.status, 416);
    assert_eq!(none.header("Content-Range"), Some("bytes */10"));
    let other = get(
        &mut c,
        "/",
        &[("Range", "bytes=2-4"), ("If-Range", "\"r0\"")],
    )
    .await;
    assert_eq!(
        (other.status, other.body.as_slice()),
        (200, &b"0123456789"[..])
    );
    let same = get(
        &mut c,
        "/",
        &[("Range", "bytes=2-4"), ("If-Range", "\"r1\"")],
    )
    .await;
    assert_eq!((same.status, same.body.as_slice()), (206, &b"234"[..]));
    assert_eq!(b.requests_served(), 1, "ranges never reach the upstream");
}

/// An encoded entry: several ranges get the whole of it (a `multipart/byteranges` cannot
/// carry its `Content-Encoding`), one range a `206` of the encoded bytes; a `206` carries no
/// digest of the whole.
#[tokio::test]
async fn several_ranges_of_an_encoded_hit_get_all_of_it() {
    let fields = [
        ("Cache-Control", "max-age=60"),
        ("Content-Encoding", "gzip"),
        ("Content-Digest", "sha-256=:AAAA=:"),
    ];
    let b = Backend::fixed(200, &fields, "0123456789");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let two = get(&mut c, "/", &[("Range", "bytes=0-0,-2")]).await;
    assert_eq!((two.status, two.body.as_slice()), (200, &b"0123456789"[..]));
    assert_eq!(two.header("Content-Encoding"), Some("gzip"));
    assert_eq!(two.header("Content-Digest"), Some("sha-256=:AAAA=:"));
    let one = get(&mut c, "/", &[("Range", "bytes=2-4")]).await;
    assert_eq!((one.status, one.body.as_slice()), (206, &b"234"[..]));
    assert_eq!(one.header("Content-Encoding"), Some("gzip"));
    assert_eq!(one.header("Content-Digest"), None);
    assert_eq!(b.requests_served(), 1);
}

/// `If-None-Match` and `If-Modified-Since` on a hit are weighed against the stored
/// `ETag` and `Last-Modified` (304 from the store); `If-Match` is the origin's to weigh:
/// forwarded.
#[tokio::test]
async fn a_hit_answers_conditions_from_the_stored_validators() {
    let fields = [
        ("Cache-Control", "max-age=60"),
        ("ETag", "\"v7\""),
        ("Last-Modified", "Mon, 01 Jan 2001 00:00:00 GMT"),
    ];
    let b = Backend::fixed(200, &fields, "payload");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let not_modified: [&[(&str, &str)]; 3] = [
        &[("If-None-Match", "\"v7\"")],
        &[("If-None-Match", "\"v0\", W/\"v7\"")],
        &[("If-Modified-Since", "Mon, 01 Jan 2001 00:00:00 GMT")],
    ];
    for asked in not_modified {
        let r = get(&mut c, "/", asked).await;
        assert_eq!(r.status, 304, "{asked:?}");
        assert!(r.body.is_empty());
        assert_eq!(r.header("ETag"), Some("\"v7\""));
        assert_eq!(r.header("Cache-Control"), Some("max-age=60"));
        assert_eq!(r.header("Cache-Status"), Some("weir; hit"));
    }
    let modified: [&[(&str, &str)]; 2] = [
        &[("If-None-Match", "\"v0\"")],
        &[("If-Modified-Since", "Sun, 31 Dec 2000 00:00:00 GMT")],
    ];
    for asked in modified {
        let r = get(&mut c, "/", asked).await;
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"payload"[..]),
            "{asked:?}"
        );
    }
    assert_eq!(
        b.requests_served(),
        1,
        "conditions on a hit never reach the upstream"
    );
    let r = get(&mut c, "/", &[("If-Match", "\"v7\"")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(b.requests_served(), 2, "If-Match goes to the origin");
}

/// A `304` from the store carries the `ETag` the `200` for the same request carries:
/// weakened only when that 200 is compressed (not for a type the route does not
/// compress, a body under `min_size`, one already encoded, nor on a route without
/// compression), for HTTP/1.1 and HTTP/2 clients.
#[tokio::test]
async fn a_304_from_the_store_carries_the_200_s_etag() {
    let long = "compressible text ".repeat(100);
    let compression = r#"compression = { algorithms = ["gzip"], types = ["text/*"] }"#;
    let cases: [(&str, &str, Option<&str>, &[&str]); 5] = [
        ("text/plain", &long, None, &[compression]),
        ("image/png", &long, None, &[compression]),
        ("text/plain", "short", None, &[compression]),
        ("text/plain", &long, Some("gzip"), &[compression]),
        ("text/plain", &long, None, &[]),
    ];
    for (kind, body, encoded, route) in cases {
        let mut fields = vec![
            ("Cache-Control", "max-age=60"),
            ("ETag", "\"v7\""),
            ("Content-Type", kind),
        ];
        fields.extend(encoded.map(|e| ("Content-Encoding", e)));
        let b = Backend::fixed(200, &fields, body);
        let weir = cached_route(b.addr(), route).start();
        let mut c = weir.client().await;
        let case = format!("{kind}, {} bytes, {encoded:?}, {route:?}", body.len());
        get(&mut c, "/", &[("Accept-Encoding", "gzip")]).await;
        let full = get(&mut c, "/", &[("Accept-Encoding", "gzip")]).await;
        assert_eq!(full.header("Cache-Status"), Some("weir; hit"), "{case}");
        let etag = full.header("ETag").expect("the 200's ETag").to_owned();
        let asked = [
            ("Accept-Encoding", "gzip"),
            ("If-None-Match", etag.as_str()),
        ];
        let r = get(&mut c, "/", &asked).await;
        assert_eq!(r.status, 304, "{case}");
        assert_eq!(r.header("ETag"), Some(etag.as_str()), "{case}");
        assert_eq!(r.header("Cache-Status"), Some("weir; hit"), "{case}");
        let compressed = full.header("Content-Encoding") == Some("gzip") && encoded.is_none();
        assert_eq!(etag.starts_with("W/"), compressed, "{case}");
        // An HTTP/2 client's 304 is planned the same way.
        let mut h2 = common::h2c_client(weir.addr).await;
        let asked = [
            ("accept-encoding", "gzip"),
            ("if-none-match", etag.as_str()),
        ];
        let (status, headers, _) = h2_get(&mut h2, "/", &asked).await;
        assert_eq!(status, 304, "{case}");
        assert_eq!(
            headers.get("etag").map(|v| v.to_str().unwrap()),
            Some(etag.as_str()),
            "{case}"
        );
    }
}

fn cache_status(headers: &http::HeaderMap) -> Option<&str> {
    headers.get("cache-status").and_then(|v| v.to_str().ok())
}

/// An HTTP/2 client's misses are stored as an HTTP/1.1 client's are, and 50 concurrent
/// ones on one connection send one request upstream.
#[tokio::test]
async fn an_http2_client_s_misses_are_stored_and_collapsed() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let up = Scripted::gated(fresh_for_a_minute, Some(gate.clone())).await;
    let weir = cached(up.addr, "", "").start();
    let h2 = common::h2c_client(weir.addr).await;
    let mut streams = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let mut h2 = h2.clone();
        streams.spawn(async move { h2_get(&mut h2, "/hot", &[]).await });
    }
    let waits = "weir_cache_collapsed_waits_total{store=\"mem\"}";
    weir.wait_metric(waits, 49).await;
    // The filler's request may still be on its way to the (gated) upstream.
    let reached = weir_testkit::wait_until_async(common::WAIT, || !up.heads().is_empty());
    assert!(reached.await, "the filler's request reaches the upstream");
    assert_eq!(up.heads().len(), 1);
    gate.add_permits(50);
    let mut statuses = Vec::new();
    while let Some(done) = streams.join_next().await {
        let (status, headers, body) = done.unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"hot"[..]));
        statuses.push(cache_status(&headers).unwrap().to_owned());
    }
    let count = |s: &str| statuses.iter().filter(|c| *c == s).count();
    assert_eq!(count("weir; fwd=uri-miss"), 1);
    assert_eq!(count("weir; hit; collapsed"), 49);
    let mut h2 = h2;
    let (_, headers, body) = h2_get(&mut h2, "/hot", &[]).await;
    assert_eq!(
        (cache_status(&headers), body.as_slice()),
        (Some("weir; hit"), &b"hot"[..])
    );
    assert_eq!(up.heads().len(), 1, "one request upstream for 51 requests");
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 1);
}

/// An HTTP/2 client's stale entry is revalidated with one conditional request, and the
/// upstream's 304 refreshes it.
#[tokio::test]
async fn an_http2_client_s_stale_entry_is_revalidated() {
    let up = Scripted::start(etag_v1).await;
    let weir = cached(up.addr, "", "").start();
    let mut h2 = common::h2c_client(weir.addr).await;
    let (_, headers, body) = h2_get(&mut h2, "/r", &[]).await;
    assert_eq!(
        (cache_status(&headers), body.as_slice()),
        (Some("weir; fwd=uri-miss"), &b"version"[..])
    );
    let (status, headers, body) = h2_get(&mut h2, "/r", &[]).await;
    assert_eq!((status, body.as_slice()), (200, &b"version"[..]));
    assert_eq!(
        cache_status(&headers),
        Some("weir; fwd=stale; fwd-status=304")
    );
    let (_, headers, _) = h2_get(&mut h2, "/r", &[]).await;
    assert_eq!(cache_status(&headers), Some("weir; hit"));
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[1].contains("If-None-Match: \"v1\""), "{}", heads[1]);
}

/// A disk entry whose body is past what a hit reads where it is routed (64 KiB) is read
/// on the blocking pool for an HTTP/2 client too: a hit, not a request upstream.
#[tokio::test]
async fn a_large_disk_entry_is_served_to_an_http2_client() {
    let dir = DiskDir::new("large-h2");
    let big = "x".repeat(100 << 10);
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], &big);
    let weir = cached_in(b.addr(), "", &dir.store()).start();
    let mut h2 = common::h2c_client(weir.addr).await;
    let (_, headers, body) = h2_get(&mut h2, "/big", &[]).await;
    assert_eq!(cache_status(&headers), Some("weir; fwd=uri-miss"));
    assert_eq!(body.len(), big.len());
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let (status, headers, body) = h2_get(&mut h2, "/big", &[]).await;
    assert_eq!((status, cache_status(&headers)), (200, Some("weir; hit")));
    assert_eq!(body, big.as_bytes());
    assert_eq!(b.requests_served(), 1, "the hit never reaches the upstream");
}

#[test]
fn a_route_naming_a_missing_store_is_rejected_with_its_place() {
    let text = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners.routes]]
name = "c"
upstream = "up"
cache = { store = "nope" }

[upstreams.up]
servers = [{ addr = "127.0.0.1:1" }]
"#;
    let e = weir_config::parse_str(text, "weir.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("weir.toml:9"), "{e}");
    assert!(e.contains("listeners[0].routes[0].cache.store"), "{e}");
    assert!(e.contains("[caches.nope]"), "{e}");
}

#[test]
fn a_disk_store_without_a_usable_path_or_a_max_size_is_rejected_with_its_place() {
    let file = std::env::temp_dir().join(format!("weir-not-a-dir-{}", std::process::id()));
    std::fs::write(&file, "x").unwrap();
    let cases = [
        (
            "kind = \"disk\"\nmax_size = \"1GiB\"",
            "caches.d.path",
            "has no path",
        ),
        (
            "kind = \"disk\"\npath = \"/tmp/weir-x\"",
            "caches.d.max_size",
            "no max_size",
        ),
        (
            &format!(
                "kind = \"disk\"\nmax_size = \"1GiB\"\npath = \"{}/sub\"",
                file.display()
            ),
            "caches.d.path",
            "is not a directory",
        ),
        (
            "kind = \"memory\"\npath = \"/tmp\"",
            "caches.d.path",
            "memory cache store has no path",
        ),
        (
            "kind = \"disk\"\npath = \"/tmp/w\"\nmax_size = 1\n\n\
             [caches.e]\nkind = \"disk\"\npath = \"/tmp/w\"\nmax_size = 1",
            "caches.e.path",
            "[caches.d] has this path too",
        ),
    ];
    for (keys, field, says) in cases {
        let listener = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n";
        let text = format!("{listener}\n[caches.d]\n{keys}\n");
        let e = weir_config::parse_str(&text, "weir.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("weir.toml:"), "{e}");
        assert!(e.contains(field) && e.contains(says), "{keys}: {e}");
    }
    std::fs::remove_file(file).unwrap();
}

/// An upstream answering each request with what `reply` makes of its head and of how
/// many requests came before it (an empty answer: the connection closes), recording the
/// heads; keep-alive, bodiless requests only.
struct Scripted {
    addr: SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// How a [`Scripted`] upstream answers: from the request head and its index.
type Reply = fn(&str, usize) -> String;

/// Holds a [`Scripted`] upstream's responses until the test adds permits.
type Gate = std::sync::Arc<tokio::sync::Semaphore>;

impl Scripted {
    async fn start(reply: Reply) -> Scripted {
        Scripted::gated(reply, None).await
    }

    async fn gated(reply: Reply, gate: Option<Gate>) -> Scripted {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (seen, gate) = (seen.clone(), gate.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            let mut more = [0u8; 4096];
                            match s.read(&mut more).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&more[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                        buf.drain(..end + 4);
                        let response = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(head);
                            reply(&seen[seen.len() - 1], seen.len() - 1)
                        };
                        if response.is_empty() {
                            return;
                        }
                        if let Some(gate) = &gate {
                            gate.acquire().await.unwrap().forget();
                        }
                        if s.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Scripted { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// `ETag: "v1"`, stale at once (`max-age=0`): a `304` to `If-None-Match: "v1"`.
fn etag_v1(head: &str, _: usize) -> String {
    if head.contains("If-None-Match: \"v1\"") {
        return "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n"
            .into();
    }
    "HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nCache-Control: max-age=0\r\nContent-Length: 7\r\n\r\nversion".into()
}

#[tokio::test]
async fn a_stale_entry_is_revalidated_once_and_a_304_refreshes_it() {
    let up = Scripted::start(etag_v1).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/r", &[]).await;
    assert_eq!(first.body, b"version");
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    // Stale: one conditional request, answered 304; the client gets the stored body.
    let second = get(&mut c, "/r", &[]).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body, b"version");
    assert_eq!(second.header("ETag"), Some("\"v1\""));
    assert_eq!(
        second.header("Cache-Control"),
        Some("max-age=60"),
        "the 304's fields replace the stored ones"
    );
    assert_eq!(
        second.header("Cache-Status"),
        Some("weir; fwd=stale; fwd-status=304")
    );
    // Refreshed by the 304 (max-age=60 now): a hit, nothing more upstream.
    let third = get(&mut c, "/r", &[]).await;
    assert_eq!(third.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(third.body, b"version");
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(!heads[0].contains("If-None-Match"));
    let conditional: Vec<_> = heads
        .iter()
        .filter(|h| h.contains("If-None-Match"))
        .collect();
    assert_eq!(
        conditional.len(),
        1,
        "exactly one conditional request: {heads:?}"
    );
}

/// `Last-Modified` only: revalidated with `If-Modified-Since`; the upstream's new version
/// (a 200) replaces the entry.
fn last_modified(head: &str, _: usize) -> String {
    let lm = "Last-Modified: Mon, 01 Jan 2001 00:00:00 GMT\r\n";
    if head.contains("If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT") {
        return format!(
            "HTTP/1.1 200 OK\r\n{lm}Cache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nnew"
        );
    }
    format!("HTTP/1.1 200 OK\r\n{lm}Cache-Control: max-age=0\r\nContent-Length: 3\r\n\r\nold")
}

#[tokio::test]
async fn a_changed_resource_replaces_the_stale_entry() {
    let up = Scripted::start(last_modified).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"old");
    let second = get(&mut c, "/", &[]).await;
    assert_eq!(second.body, b"new");
    assert_eq!(second.header("Cache-Status"), Some("weir; fwd=stale"));
    let third = get(&mut c, "/", &[]).await;
    assert_eq!(
        (third.body.as_slice(), third.header("Cache-Status")),
        (&b"new"[..], Some("weir; hit"))
    );
    assert_eq!(up.heads().len(), 2);
}

#[tokio::test]
async fn a_client_condition_goes_up_as_it_is() {
    let up = Scripted::start(etag_v1).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let r = get(&mut c, "/", &[("If-None-Match", "\"v1\"")]).await;
    assert_eq!(
        r.status, 304,
        "the client's own condition is answered by the upstream"
    );
    let heads = up.heads();
    assert_eq!(heads.len(), 2);
    assert_eq!(heads[1].matches("If-None-Match").count(), 1, "{}", heads[1]);
}

fn fresh_for_a_minute(_: &str, _: usize) -> String {
    "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nhot".into()
}

#[tokio::test]
async fn concurrent_misses_send_one_request_upstream() {
    collapse_200_misses("kind = \"memory\"").await;
}

/// A disk store lets the waiting misses go once the file is written: they find it.
#[tokio::test]
async fn concurrent_misses_of_a_disk_store_send_one_request_upstream() {
    let dir = DiskDir::new("collapse");
    collapse_200_misses(&dir.store()).await;
}

/// A response's status, body and `Cache-Status`.
type Got = (u16, Vec<u8>, Option<String>);

/// `n` clients each sending `GET path` at once, on a connection of its own.
fn concurrent_gets(addr: SocketAddr, path: &'static str, n: usize) -> tokio::task::JoinSet<Got> {
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..n {
        clients.spawn(async move {
            let mut c = Client::connect(addr).await.expect("connect");
            let r = get(&mut c, path, &[]).await;
            let cache_status = r.header("Cache-Status").map(str::to_owned);
            (r.status, r.body, cache_status)
        });
    }
    clients
}

/// The `Cache-Status` of each of `clients`' responses, each a 200 with `body`.
async fn cache_statuses(mut clients: tokio::task::JoinSet<Got>, body: &[u8]) -> Vec<String> {
    let mut statuses = Vec::new();
    while let Some(done) = clients.join_next().await {
        let (status, got, cache_status) = done.unwrap();
        assert_eq!((status, got.as_slice()), (200, body));
        statuses.push(cache_status.unwrap());
    }
    statuses
}

/// 200 concurrent misses of one key, with the store `store`: one goes upstream.
async fn collapse_200_misses(store: &str) {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let up = Scripted::gated(fresh_for_a_minute, Some(gate.clone())).await;
    let weir = cached_in(up.addr, "", store).start();
    let clients = concurrent_gets(weir.addr, "/hot", 200);
    // Every miss but the first waits for the first's fetch, held at the upstream.
    let waits = "weir_cache_collapsed_waits_total{store=\"mem\"}";
    weir.wait_metric(waits, 199).await;
    assert_eq!(up.heads().len(), 1);
    gate.add_permits(200);
    let statuses = cache_statuses(clients, b"hot").await;
    let count = |s: &str| statuses.iter().filter(|c| *c == s).count();
    assert_eq!(count("weir; fwd=uri-miss"), 1);
    assert_eq!(count("weir; hit; collapsed"), 199);
    assert_eq!(up.heads().len(), 1, "one request upstream for 200 misses");
    assert_eq!(weir.metric("weir_cache_misses_total{store=\"mem\"}"), 200);
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 1);
}

#[tokio::test]
async fn a_stale_disk_entry_is_revalidated_and_a_304_rewrites_its_head() {
    let dir = DiskDir::new("revalidate");
    let up = Scripted::start(etag_v1).await;
    let weir = cached_in(up.addr, "", &dir.store()).start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/r", &[]).await.body, b"version");
    // Written after the response: the next request finds the stale entry once it is.
    let stored = "weir_cache_stored_total{store=\"mem\"}";
    weir.wait_metric(stored, 1).await;
    let second = get(&mut c, "/r", &[]).await;
    assert_eq!(
        second.body, b"version",
        "the stored body, read from its file"
    );
    assert_eq!(
        second.header("Cache-Status"),
        Some("weir; fwd=stale; fwd-status=304")
    );
    weir.wait_metric(stored, 2).await;
    let third = get(&mut c, "/r", &[]).await;
    assert_eq!(third.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(third.header("Cache-Control"), Some("max-age=60"));
    assert_eq!(third.body, b"version");
    assert_eq!(up.heads().len(), 2);
}

/// [`etag_v1`] with a 2 MiB body: a disk store takes a while to rewrite its file.
fn etag_v1_2mib(head: &str, _: usize) -> String {
    if head.contains("If-None-Match: \"v1\"") {
        return "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n"
            .into();
    }
    let body = "v".repeat(2 << 20);
    format!("HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nCache-Control: max-age=0\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

/// Waits until no request of the route fetches `key` (none waits for another's fetch of
/// it). A store counts an entry stored (`weir_cache_stored_total`) just before the fetch
/// that stored it ends (`Store::release`, on the blocking pool for a disk store): on a
/// loaded machine the count can come long before it.
async fn fetch_over(weir: &common::Weir, key: &[u8]) {
    use weir_core::cache::store::Turn;
    let snapshot = weir.proxy().snapshot();
    let mut routes = snapshot.config.listeners.iter().flat_map(|l| &l.routes);
    let cache = routes
        .find_map(|r| r.filters.cache.as_ref())
        .expect("a cache");
    let store = &snapshot.caches[cache.store];
    let over = async {
        loop {
            match store.turn(key, &cache.scope) {
                // Nothing pending: the turn taken here is given back at once.
                Turn::Lead => return store.release(key, &cache.scope),
                // Closed (`Err`) when that fetch ends.
                Turn::Wait(mut fetch) => while fetch.changed().await.is_ok() {},
            }
        }
    };
    let ended = tokio::time::timeout(common::WAIT, over).await;
    assert!(ended.is_ok(), "the fetch of the key never ends");
}

/// Requests waiting for a stale disk entry's revalidation are let go once the `304`'s head
/// is written: they find the entry fresh, and one conditional request goes upstream.
#[tokio::test]
async fn requests_waiting_for_a_disk_revalidation_find_the_refreshed_entry() {
    let dir = DiskDir::new("refresh-collapse");
    let gate = Gate::new(tokio::sync::Semaphore::new(1));
    let up = Scripted::gated(etag_v1_2mib, Some(gate.clone())).await;
    let store = format!("{}\nmax_object_size = \"4MiB\"", dir.store());
    let weir = cached_in(up.addr, ", lock_timeout = \"30s\"", &store).start();
    let mut c = weir.client().await;
    let body = "v".repeat(2 << 20).into_bytes();
    assert_eq!(get(&mut c, "/r", &[]).await.body, body);
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    // Counted stored a moment before that fetch lets its waiters go: a request coming in
    // between would wait for it, find the entry stale and go upstream on its own.
    fetch_over(&weir, b"http://example.com/r").await;
    let clients = concurrent_gets(weir.addr, "/r", 20);
    // Every request but the revalidating one waits for it, held at the upstream.
    let waits = "weir_cache_collapsed_waits_total{store=\"mem\"}";
    weir.wait_metric(waits, 19).await;
    gate.add_permits(40);
    let statuses = cache_statuses(clients, &body).await;
    let count = |s: &str| statuses.iter().filter(|c| *c == s).count();
    assert_eq!(count("weir; fwd=stale; fwd-status=304"), 1, "{statuses:?}");
    assert_eq!(count("weir; hit; collapsed"), 19, "{statuses:?}");
    assert_eq!(up.heads().len(), 2, "one conditional request upstream");
}

/// A reload that changes only a disk store's sizes keeps the store (its entries, its
/// counts, one index of its directory) and applies them: a smaller `max_size` evicts at once.
#[tokio::test]
async fn a_reload_resizing_a_disk_store_keeps_it_and_evicts_to_the_new_size() {
    let dir = DiskDir::new("resize");
    let up = Scripted::start(fresh_for_a_minute).await;
    let weir = cached_in(up.addr, "", &dir.store()).start();
    let mut c = weir.client().await;
    for path in ["/a", "/b", "/c"] {
        get(&mut c, path, &[]).await;
        // One at a time, so that the use order is the request order.
        let stored = (path.as_bytes()[1] - b'a' + 1) as u64;
        weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", stored)
            .await;
    }
    let bytes = weir.metric("weir_cache_bytes{store=\"mem\"}");
    // Room for one and a half entries: the newest stays.
    let max = bytes / 2;
    let sizes = format!("max_size = \"{max}B\"\nmax_object_size = \"1KiB\"");
    let store = dir.store().replace("max_size = \"16MiB\"", &sizes);
    weir.apply_text(&cached_in(up.addr, "", &store).toml())
        .expect("reload");
    assert_eq!(weir.metric("weir_cache_entries{store=\"mem\"}"), 1);
    assert_eq!(
        weir.metric("weir_cache_stored_total{store=\"mem\"}"),
        3,
        "the same store"
    );
    assert_eq!(weir.metric("weir_cache_evictions_total{store=\"mem\"}"), 2);
    let files = std::fs::read_dir(&dir.0).expect("dir").flatten();
    let files = files.flat_map(|d| std::fs::read_dir(d.path()).expect("subdir").flatten());
    assert_eq!(files.count(), 1, "the evicted entries' files are removed");
    assert_eq!(
        get(&mut c, "/c", &[]).await.header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(
        get(&mut c, "/a", &[]).await.header("Cache-Status"),
        Some("weir; fwd=uri-miss")
    );
}

#[tokio::test]
async fn a_waiting_miss_goes_upstream_itself_after_lock_timeout() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let up = Scripted::gated(fresh_for_a_minute, Some(gate.clone())).await;
    let weir = cached(up.addr, ", lock_timeout = \"200ms\"", "").start();
    let addr = weir.addr;
    let first = tokio::spawn(async move {
        let mut c = Client::connect(addr).await.unwrap();
        get(&mut c, "/slow", &[]).await
    });
    weir_testkit::wait_until_async(common::WAIT, || up.heads().len() == 1).await;
    let mut c = weir.client().await;
    let waiter = tokio::spawn(async move { get(&mut c, "/slow", &[]).await });
    // The waiter gives up on the held fetch and sends its own request.
    assert!(weir_testkit::wait_until_async(common::WAIT, || up.heads().len() == 2).await);
    gate.add_permits(2);
    assert_eq!(first.await.unwrap().body, b"hot");
    let second = waiter.await.unwrap();
    assert_eq!(second.body, b"hot");
    assert_eq!(second.header("Cache-Status"), Some("weir; fwd=uri-miss"));
}

/// `ETag: "v1"`, stale at once but for `stale-while-revalidate=60`: a `304` (fresh for a
/// minute) to `If-None-Match: "v1"`.
fn etag_v1_swr(head: &str, _: usize) -> String {
    let swr = "ETag: \"v1\"\r\nCache-Control: max-age=0, stale-while-revalidate=60\r\n";
    if head.contains("If-None-Match: \"v1\"") {
        return "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n"
            .into();
    }
    format!("HTTP/1.1 200 OK\r\n{swr}Content-Length: 7\r\n\r\nversion")
}

/// `stale-while-revalidate`: a stale entry within its window answers at once (HTTP/1.1
/// and HTTP/2 clients alike, the upstream held), and one conditional request in the
/// background, whatever the number of requests, refreshes it.
#[tokio::test]
async fn a_stale_while_revalidate_entry_answers_at_once_and_is_refreshed_once() {
    let gate = Gate::new(tokio::sync::Semaphore::new(1));
    let up = Scripted::gated(etag_v1_swr, Some(gate.clone())).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/", &[]).await;
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    // The upstream answers nothing more until the gate opens: these never wait for it.
    let swr = "weir; hit; detail=stale-while-revalidate";
    for _ in 0..20 {
        // Bounded only so that a request waiting for the held upstream fails the test
        // instead of hanging it.
        let at_once =
            tokio::time::timeout(std::time::Duration::from_secs(10), get(&mut c, "/", &[]));
        let r = at_once.await.expect("answered without the upstream");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"version"[..]));
        assert_eq!(r.header("Cache-Status"), Some(swr));
        assert!(r.header("Age").is_some());
    }
    let mut h2 = common::h2c_client(weir.addr).await;
    let (status, headers, body) = h2_get(&mut h2, "/", &[]).await;
    assert_eq!((status, cache_status(&headers)), (200, Some(swr)));
    assert_eq!(body, b"version");
    assert_eq!(
        weir.metric("weir_cache_revalidations_total{store=\"mem\"}"),
        1
    );
    assert!(up.heads().len() <= 2, "one revalidation: {:?}", up.heads());
    gate.add_permits(1);
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    let refreshed = get(&mut c, "/", &[]).await;
    assert_eq!(refreshed.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(refreshed.header("Cache-Control"), Some("max-age=60"));
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[1].contains("If-None-Match: \"v1\""), "{}", heads[1]);
}

/// [`etag_v1_swr`] with a 1 MiB body: a disk store's file for it is over 64 KiB.
fn etag_v1_swr_1mib(head: &str, index: usize) -> String {
    let small = etag_v1_swr(head, index);
    match small.strip_suffix("Content-Length: 7\r\n\r\nversion") {
        Some(head) => format!(
            "{head}Content-Length: {}\r\n\r\n{}",
            1 << 20,
            "v".repeat(1 << 20)
        ),
        None => small,
    }
}

/// A stale disk entry over 64 KiB answers at once while it is revalidated too (it was
/// revalidated first: its body had to be read into memory for the `304` to store it
/// again), sent from its file; the background `304` stores the new head with the body
/// copied file to file.
#[tokio::test]
async fn a_large_stale_disk_entry_answers_while_it_is_revalidated() {
    let dir = DiskDir::new("swr-large");
    let up = Scripted::start(etag_v1_swr_1mib).await;
    let weir = cached_in(up.addr, "", &dir.store()).start();
    let mut c = weir.client().await;
    let body = "v".repeat(1 << 20).into_bytes();
    assert_eq!(get(&mut c, "/", &[]).await.body, body);
    let stored = "weir_cache_stored_total{store=\"mem\"}";
    weir.wait_metric(stored, 1).await;
    let stale = get(&mut c, "/", &[]).await;
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale-while-revalidate")
    );
    assert!(stale.body == body, "the stored body, whole");
    weir.wait_metric(stored, 2).await;
    for _ in 0..2 {
        let refreshed = get(&mut c, "/", &[]).await;
        assert_eq!(refreshed.header("Cache-Status"), Some("weir; hit"));
        assert_eq!(refreshed.header("Cache-Control"), Some("max-age=60"));
        assert!(refreshed.body == body, "the copied body, whole");
    }
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[1].contains("If-None-Match: \"v1\""), "{}", heads[1]);
    assert_eq!(weir.metric("weir_cache_errors_total{store=\"mem\"}"), 0);
}

/// No validator: `old` (stale at once but for `stale-while-revalidate=60`), then `new`.
fn old_then_new(_: &str, index: usize) -> String {
    let (cc, body) = match index {
        0 => ("max-age=0, stale-while-revalidate=60", "old"),
        _ => ("max-age=60", "new"),
    };
    format!("HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\nContent-Length: 3\r\n\r\n{body}")
}

/// A stale entry without a validator is fetched again in the background, unconditionally,
/// and the new response replaces it.
#[tokio::test]
async fn a_background_revalidation_stores_a_new_response() {
    let up = Scripted::start(old_then_new).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"old");
    let stale = get(&mut c, "/", &[]).await;
    assert_eq!(stale.body, b"old");
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale-while-revalidate")
    );
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    let new = get(&mut c, "/", &[]).await;
    assert_eq!(
        (new.body.as_slice(), new.header("Cache-Status")),
        (&b"new"[..], Some("weir; hit"))
    );
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(!heads[1].contains("If-"), "{}", heads[1]);
}

/// The first answer is stored (stale at once, with the given `Cache-Control`); later ones
/// fail as the test's name says.
macro_rules! then_failing {
    ($name:ident, $cache_control:literal, $failure:expr) => {
        fn $name(_: &str, index: usize) -> String {
            if index == 0 {
                let cc = $cache_control;
                return format!(
                    "HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\nContent-Length: 5\r\n\r\nstale"
                );
            }
            $failure.to_string()
        }
    };
}

const FAIL_500: &str = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom";
then_failing!(if_error_then_500, "max-age=0, stale-if-error=60", FAIL_500);
then_failing!(plain_then_500, "max-age=0", FAIL_500);
then_failing!(revalidate_then_500, "max-age=0, must-revalidate", FAIL_500);
then_failing!(plain_then_close, "max-age=0", "");

/// Fetches `/` once (stored), then again: the upstream fails. Returns the second response.
async fn after_failure(reply: Reply, route_keys: &str) -> (Response, usize) {
    let up = Scripted::start(reply).await;
    let weir = cached(up.addr, route_keys, "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"stale");
    let mut c = weir.client().await;
    let second = get(&mut c, "/", &[]).await;
    (second, up.heads().len())
}

#[tokio::test]
async fn a_stale_entry_answers_for_an_upstream_failure_when_allowed() {
    let served = |r: &Response| {
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"stale");
        assert_eq!(r.header("Cache-Status"), Some("weir; hit; detail=stale"));
        assert!(r.header("Age").is_some());
    };
    // The response's own stale-if-error, no route setting.
    served(&after_failure(if_error_then_500, "").await.0);
    // The route's serve_stale_on, for each failure it names.
    served(
        &after_failure(plain_then_500, ", serve_stale_on = [\"5xx\"]")
            .await
            .0,
    );
    let (r, tries) = after_failure(plain_then_close, ", serve_stale_on = [\"error\"]").await;
    served(&r);
    assert!(tries >= 2, "the upstream was tried");
}

/// Answers from the store after the upstream was asked (a stale entry a 304 refreshed,
/// one answering for a failure) are sent as hits are: the route's `response_headers`
/// apply.
#[tokio::test]
async fn answers_from_the_store_after_the_upstream_get_the_routes_edits() {
    let rules = r#"response_headers = { set = { "X-Served-By" = "weir" } }"#;
    let stale_on = r#"cache = { store = "mem", serve_stale_on = ["error"] }"#;
    for (reply, status) in [
        (etag_v1 as Reply, "weir; fwd=stale; fwd-status=304"),
        (plain_then_close, "weir; hit; detail=stale"),
    ] {
        let up = Scripted::start(reply).await;
        let conf = Conf::new()
            .route("c", "up", &[stale_on, rules])
            .upstream("up", &[up.addr], &[])
            .table("[caches.mem]\nkind = \"memory\"");
        let weir = conf.start();
        let mut c = weir.client().await;
        get(&mut c, "/", &[]).await;
        let mut c = weir.client().await;
        let r = get(&mut c, "/", &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("Cache-Status"), Some(status));
        assert_eq!(r.header("X-Served-By"), Some("weir"), "{status}");
    }
}

#[tokio::test]
async fn the_failure_is_relayed_when_stale_serving_is_not_allowed() {
    // Neither the response nor the route allows it; or the route allows another failure.
    for keys in ["", ", serve_stale_on = [\"timeout\", \"error\"]"] {
        let r = after_failure(plain_then_500, keys).await.0;
        assert_eq!((r.status, r.body.as_slice()), (500, &b"boom"[..]), "{keys}");
    }
    // must-revalidate forbids it whatever the route says.
    let all = ", serve_stale_on = [\"error\", \"timeout\", \"5xx\"]";
    let r = after_failure(revalidate_then_500, all).await.0;
    assert_eq!(r.status, 500);
    let r = after_failure(plain_then_close, "").await.0;
    assert_eq!(r.status, 502);
}

#[tokio::test]
async fn a_stale_entry_answers_for_a_timeout() {
    let gate = Gate::new(tokio::sync::Semaphore::new(1));
    let up = Scripted::gated(plain_then_500, Some(gate)).await;
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &["cache = { store = \"mem\", serve_stale_on = [\"timeout\"] }"],
        )
        .upstream("up", &[up.addr], &["response_timeout = \"300ms\""])
        .table("[caches.mem]\nkind = \"memory\"")
        .start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"stale");
    // The gate has no permit left: the upstream never answers.
    let r = get(&mut c, "/", &[]).await;
    assert_eq!(r.body, b"stale");
    assert_eq!(r.header("Cache-Status"), Some("weir; hit; detail=stale"));
    assert_eq!(weir.metric("weir_cache_stale_total{store=\"mem\"}"), 1);
}

#[tokio::test]
async fn the_access_log_says_what_the_cache_did() {
    let log = common::JsonLog::new("cache-field");
    let up = Scripted::start(etag_v1).await;
    let weir = cached(up.addr, "", "")
        .listener(&log.listener_line())
        .route("plain", "up", &["path_prefix = \"/plain/\""])
        .start();
    let mut c = weir.client().await;
    get(&mut c, "/r", &[]).await; // miss, stored stale at once
    get(&mut c, "/r", &[]).await; // revalidated by a 304, fresh for a minute
    get(&mut c, "/r", &[]).await; // hit
    get(&mut c, "/plain/x", &[]).await; // a route without cache
    let lines = log.lines(4);
    let field = |line: &str| {
        line.split(",\"cache\":")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string()
    };
    let fields: Vec<String> = lines.iter().map(|l| field(l)).collect();
    assert_eq!(fields, ["\"miss\"", "\"revalidated\"", "\"hit\"", "null"]);
}

#[tokio::test]
async fn a_chunked_response_compressed_for_the_client_is_stored_as_it_came() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let b = Backend::raw_response(raw);
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &[
                "cache = { store = \"mem\" }",
                "compression = { min_size = 0 }",
            ],
        )
        .upstream("up", &[b.addr()], &[])
        .table("[caches.mem]\nkind = \"memory\"")
        .start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/", &[("Accept-Encoding", "gzip")]).await;
    assert_eq!(first.header("Content-Encoding"), Some("gzip"));
    let mut c = weir.client().await;
    let hit = get(&mut c, "/", &[]).await;
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(hit.body, b"hello world", "the identity body, decoded");
    assert_eq!(b.requests_served(), 1);
}

/// An upstream whose second response (the background revalidation's) is a chunked body
/// that never ends (a chunk every 50 ms: no read waits `response_timeout`); its other
/// responses are `swr` (stale at once but for `stale-while-revalidate=60`). Returns its
/// address and the number of requests it got.
async fn trickling_second() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut more = [0u8; 4096];
                    match s.read(&mut more).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&more[..n]),
                    }
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    buf.drain(..end + 4);
                    if seen.fetch_add(1, SeqCst) != 1 {
                        let swr = "Cache-Control: max-age=0, stale-while-revalidate=60";
                        let r = format!("HTTP/1.1 200 OK\r\n{swr}\r\nContent-Length: 3\r\n\r\nold");
                        if s.write_all(r.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let head = "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n";
                    if s.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    while s.write_all(b"1\r\nx\r\n").await.is_ok() {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    return;
                }
            });
        }
    });
    (addr, count)
}

/// A background revalidation whose response body never ends is cut at the upstream's
/// `response_timeout`: the key is let go, and a request that must revalidate first
/// (`Cache-Control: no-cache`) goes upstream then, not after the route's `lock_timeout`.
#[tokio::test]
async fn a_background_revalidation_that_never_ends_lets_its_key_go() {
    let (addr, count) = trickling_second().await;
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &["cache = { store = \"mem\", lock_timeout = \"60s\" }"],
        )
        .upstream("up", &[addr], &["response_timeout = \"1s\""])
        .table("[caches.mem]\nkind = \"memory\"")
        .start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"old");
    let stale = get(&mut c, "/", &[]).await;
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale-while-revalidate")
    );
    let at = std::time::Instant::now();
    let first = get(&mut c, "/", &[("Cache-Control", "no-cache")]).await;
    assert_eq!(first.body, b"old");
    // Without the deadline this waits the whole lock_timeout (60 s); the bound is generous
    // for a loaded machine but far below it.
    assert!(
        at.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        at.elapsed()
    );
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// Fresh for a minute, with 127 header fields: one fewer than a response head may have.
fn many_fields(_: &str, _: usize) -> String {
    let mut head = String::from("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n");
    for i in 0..125 {
        head.push_str(&format!("X-Field-{i}: {i}\r\n"));
    }
    head + "Content-Length: 4\r\n\r\nmany"
}

/// A response whose head leaves no room for the fields a hit adds (`Age`,
/// `Cache-Status`, `Content-Length`) is relayed uncached: every hit of it would fail.
#[tokio::test]
async fn a_head_too_near_the_field_limit_is_not_stored() {
    let up = Scripted::start(many_fields).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    for _ in 0..2 {
        let r = get(&mut c, "/", &[]).await;
        assert_eq!((r.status, r.body.as_slice()), (200, &b"many"[..]));
        assert_eq!(r.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    }
    assert_eq!(up.heads().len(), 2);
}

/// `ETag: "v1"`, stale at once; a `304` that makes it `private, no-store`; then `new`.
fn etag_v1_then_no_store(head: &str, index: usize) -> String {
    match index {
        0 => etag_v1(head, index),
        1 => {
            "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: private, no-store\r\n\r\n"
                .into()
        }
        _ => "HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 3\r\n\r\nnew".into(),
    }
}

/// A `304` whose policy is no longer storable removes the entry (it is not kept, nor
/// counted as stored): the next request is a plain miss.
#[tokio::test]
async fn a_304_that_forbids_storing_removes_the_entry() {
    let up = Scripted::start(etag_v1_then_no_store).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"version");
    let refreshed = get(&mut c, "/", &[]).await;
    assert_eq!(refreshed.body, b"version");
    assert_eq!(weir.metric("weir_cache_entries{store=\"mem\"}"), 0);
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 1);
    let after = get(&mut c, "/", &[]).await;
    assert_eq!(
        (after.body.as_slice(), after.header("Cache-Status")),
        (&b"new"[..], Some("weir; fwd=uri-miss"))
    );
    let heads = up.heads();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert!(heads[1].contains("If-None-Match"), "{}", heads[1]);
    assert!(!heads[2].contains("If-None-Match"), "{}", heads[2]);
}

/// A request with a condition and a range of its own, answered from a stale entry within
/// `stale-while-revalidate`, starts the revalidation too: its head goes up without the
/// client's `If-None-Match` and `Range`, with the entry's own validator.
#[tokio::test]
async fn a_conditional_ranged_request_starts_the_background_revalidation() {
    let up = Scripted::start(etag_v1_swr).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"version");
    let asks = [("If-None-Match", "\"v0\""), ("Range", "bytes=0-2")];
    let stale = get(&mut c, "/", &asks).await;
    assert_eq!((stale.status, stale.body.as_slice()), (206, &b"ver"[..]));
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    assert_eq!(
        weir.metric("weir_cache_revalidations_total{store=\"mem\"}"),
        1
    );
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[1].contains("If-None-Match: \"v1\""), "{}", heads[1]);
    assert!(
        !heads[1].contains("v0") && !heads[1].contains("Range"),
        "{}",
        heads[1]
    );
}

/// A body of `lines` numbered lines of 8 bytes: any byte out of place shows.
fn numbered(lines: usize) -> String {
    (0..lines).map(|i| format!("{i:07}\n")).collect()
}

/// The head (lower-cased) and body of the one HTTP/1.1 response on `s` (framed by its
/// `Content-Length`), `got` its first bytes, read already.
async fn read_whole(s: &mut tokio::net::TcpStream, mut got: Vec<u8>) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 << 10];
    let read = async {
        loop {
            let head_end = got.windows(4).position(|w| w == b"\r\n\r\n");
            if let Some(end) = head_end {
                let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "));
                let length: usize = length.expect("a length").trim().parse().unwrap();
                if got.len() >= end + 4 + length {
                    return (head, got[end + 4..].to_vec());
                }
            }
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "cut after {} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), read)
        .await
        .expect("the whole response in time")
}

/// Whether this process holds a memfd of Weir's cache (a memory entry's sealed body).
fn holds_a_cache_memfd() -> bool {
    let fds = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|to| to.to_string_lossy().starts_with("/memfd:weir-cache"))
    })
}

/// A hit of a 6 MiB entry of the store `store` (more than the socket buffers on both
/// sides hold) to a slow plain-TCP HTTP/1.1 client, sent with sendfile(2) from the
/// entry's file: the entry purged while it is being sent, the client still gets all of
/// it. Then a range of it (sendfile from an offset), and the same over HTTP/2 (read from
/// the file in pieces). Returns Weir, still running.
async fn a_large_hit_purged_while_sent(store: &str) -> common::Weir {
    let big = numbered(6 << 17);
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], &big);
    let weir = cached_in(b.addr(), "", store).start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/big", &[]).await.body.len(), big.len());
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;

    let mut slow = common::small_window(weir.addr).await;
    let request = b"GET /big HTTP/1.1\r\nHost: example.com\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut slow, request)
        .await
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::io::AsyncReadExt::read(&mut slow, &mut first)
        .await
        .unwrap();
    assert!(n > 0, "the hit starts");
    first.truncate(n);
    let caches = &weir.proxy().snapshot().caches;
    assert_eq!(caches[0].purge(b"http://example.com/big", false), 1);
    let (head, body) = read_whole(&mut slow, first).await;
    assert!(head.contains("\r\ncache-status: weir; hit"), "{head}");
    assert!(
        body == big.as_bytes(),
        "{} bytes, not the entry",
        body.len()
    );

    // A new connection: the slow read can outlast the first one's keep-alive wait (5 s)
    // on a loaded machine.
    let mut c = weir.client().await;
    let again = get(&mut c, "/big", &[]).await;
    assert_eq!(again.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    // And another: writing the 6 MiB file (its sum taken in a debug build) can outlast
    // that keep-alive wait too.
    let mut c = weir.client().await;
    let range = get(&mut c, "/big", &[("Range", "bytes=5000000-")]).await;
    assert_eq!(
        (range.status, range.header("Cache-Status")),
        (206, Some("weir; hit"))
    );
    assert!(
        range.body == big.as_bytes()[5_000_000..],
        "the range's bytes"
    );
    let mut h2 = common::h2c_client(weir.addr).await;
    let (status, _, body) = h2_get(&mut h2, "/big", &[]).await;
    assert!(
        status == 200 && body == big.as_bytes(),
        "the HTTP/2 hit's bytes"
    );
    assert_eq!(b.requests_served(), 2);
    weir
}

/// A memory store keeps a large body in a sealed memfd (sent with sendfile(2)); a hit
/// holds it, so a purge while it is sent cuts nothing short.
#[tokio::test]
async fn a_large_memory_hit_goes_out_from_a_sealed_memfd_whole_even_if_purged() {
    let _weir = a_large_hit_purged_while_sent("kind = \"memory\"").await;
    assert!(holds_a_cache_memfd(), "the 6 MiB body is in a memfd");
}

/// A disk store's large hit is sent from the entry's file, held open: its removal by a
/// purge while it is sent cuts nothing short.
#[tokio::test]
async fn a_large_disk_hit_goes_out_from_its_file_whole_even_if_purged() {
    let dir = DiskDir::new("purged-while-sent");
    let _weir = a_large_hit_purged_while_sent(&dir.store()).await;
}

/// A client's `max-stale` never loosens what a shared cache serves (as nginx and Varnish
/// do): an entry that must be revalidated (`no-cache`; `s-maxage`, which implies
/// `proxy-revalidate`), or a stale one, goes upstream, even when another client's request
/// with `Authorization` stored it (`public` and `s-maxage` allow that).
#[tokio::test]
async fn a_clients_max_stale_gets_no_entry_that_must_be_revalidated() {
    let responses: [&[(&str, &str)]; 3] = [
        &[("Cache-Control", "public, no-cache")],
        &[("Cache-Control", "s-maxage=1"), ("Age", "2")],
        &[("Cache-Control", "max-age=1"), ("Age", "2")],
    ];
    for response in responses {
        let b = Backend::fixed(200, response, "alice's");
        let weir = cached(b.addr(), "", "").start();
        let mut c = weir.client().await;
        get(&mut c, "/", &[("Authorization", "Basic YWxpY2U6eA==")]).await;
        for stale in ["max-stale", "max-stale=3600", "max-age=9, max-stale"] {
            let r = get(&mut c, "/", &[("Cache-Control", stale)]).await;
            assert_ne!(
                r.header("Cache-Status"),
                Some("weir; hit"),
                "{response:?} {stale}"
            );
        }
        assert_eq!(b.requests_served(), 4, "{response:?}");
    }
}

/// Answers with the first coding the request's `Accept-Encoding` offers (as its
/// `Content-Encoding`; none: `plain`), fresh for a minute, varying on it.
fn first_coding(head: &str, _: usize) -> String {
    let offered = head
        .lines()
        .find_map(|l| l.strip_prefix("Accept-Encoding: "))
        .and_then(|v| v.split([',', ';']).next())
        .map(str::trim);
    let (field, body) = match offered {
        Some(coding) => (format!("Content-Encoding: {coding}\r\n"), coding.to_owned()),
        None => (String::new(), "plain".to_owned()),
    };
    format!(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nVary: Accept-Encoding\r\n{field}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A response is stored under the `Accept-Encoding` variant Weir picks (br, gzip or none)
/// only if that variant's coding covers its `Content-Encoding`: a coding the variant does
/// not name (zstd, deflate, `*`'s pick, gzip for a br variant) is relayed, not stored.
#[tokio::test]
async fn a_response_in_a_coding_its_variant_does_not_name_is_not_stored() {
    let up = Scripted::start(first_coding).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let cases = [
        ("zstd", None),
        ("deflate, gzip", Some("gzip")),
        ("x-gzip", None),
        ("*", None),
        ("gzip, br;q=0.001", Some("br")),
    ];
    for (i, (offer, then)) in cases.into_iter().enumerate() {
        let path = format!("/{i}");
        let sent = get(&mut c, &path, &[("Accept-Encoding", offer)]).await;
        assert_eq!(sent.body_str(), offer.split([',', ';']).next().unwrap());
        assert_eq!(sent.header("Cache-Status"), Some("weir; fwd=uri-miss"));
        let asks: Vec<_> = then.map(|v| ("Accept-Encoding", v)).into_iter().collect();
        let next = get(&mut c, &path, &asks).await;
        assert_eq!(next.header("Content-Encoding"), then, "after {offer}");
        assert_eq!(next.body_str(), then.unwrap_or("plain"), "after {offer}");
        assert_eq!(next.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    }
}

/// Routes sharing a store never share an entry: one route's upstream (beta, chosen by a
/// header) does not fill what another route (prod) answers for the same URL, nor does a
/// listener's route fill another listener's route of the same name.
#[tokio::test]
async fn routes_sharing_a_store_never_share_an_entry() {
    let fresh = [("Cache-Control", "max-age=60")];
    let (beta, prod, internal) = (
        Backend::fixed(200, &fresh, "beta"),
        Backend::fixed(200, &fresh, "prod"),
        Backend::fixed(200, &fresh, "internal"),
    );
    let store = "cache = { store = \"mem\" }";
    let weir = beta_and_prod(store, beta.addr(), prod.addr())
        .upstream("internal", &[internal.addr()], &[])
        .table(&format!(
            "[[listeners]]\nname = \"internal\"\nbind = \"127.0.0.1:0\"\nrequest_id = false\n\
             [[listeners.routes]]\nname = \"c\"\nupstream = \"internal\"\n{store}"
        ))
        .start();
    let mut c = weir.client().await;
    let first = get(&mut c, "/x/p1", &[("X-Beta", "1")]).await;
    assert_eq!(first.body_str(), "beta");
    for _ in 0..2 {
        assert_eq!(get(&mut c, "/x/p1", &[]).await.body_str(), "prod");
    }
    assert_eq!(
        prod.requests_served(),
        1,
        "prod's own entry answers the second"
    );
    let inside = weir.proxy().listener_addr("internal").unwrap();
    let mut i = Client::connect(inside).await.unwrap();
    for _ in 0..2 {
        assert_eq!(get(&mut i, "/x/p1", &[]).await.body_str(), "internal");
    }
    assert_eq!(internal.requests_served(), 1);
    assert_eq!(
        get(&mut c, "/x/p1", &[("X-Beta", "1")])
            .await
            .header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(beta.requests_served(), 1);
}

/// A client's own `no-store` on a revalidation leaves the entry in place: before, the
/// refresh found it not storable for this request and purged the key, so any client could
/// empty the store a URL at a time.
#[tokio::test]
async fn a_clients_no_store_on_a_revalidation_leaves_the_entry() {
    let up = Scripted::start(etag_v1).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/r", &[]).await.body, b"version");
    let asked = [("Cache-Control", "no-cache, no-store")];
    let second = get(&mut c, "/r", &asked).await;
    assert_eq!(second.body, b"version");
    let third = get(&mut c, "/r", &[]).await;
    assert_eq!(
        third.header("Cache-Status"),
        Some("weir; fwd=stale; fwd-status=304"),
        "the entry is still there, revalidated"
    );
    assert_eq!(third.body, b"version");
}

/// A gzip body stored for `Vary: Accept-Encoding, Origin`, stale; a `304` saying only
/// `Vary: Origin` (nginx's gzip adds its Vary to the 200, not to the 304).
fn gzip_then_304_without_its_vary(head: &str, _: usize) -> String {
    if head.contains("If-None-Match: \"g\"") {
        return "HTTP/1.1 304 Not Modified\r\nETag: \"g\"\r\nVary: Origin\r\n\
                Cache-Control: max-age=60\r\n\r\n"
            .into();
    }
    let (coding, body) = match head.contains("Accept-Encoding: gzip") {
        true => ("Content-Encoding: gzip\r\n", "GZIPPED"),
        false => ("", "plain!!"),
    };
    format!(
        "HTTP/1.1 200 OK\r\nETag: \"g\"\r\nVary: Accept-Encoding\r\nVary: Origin\r\n\
         {coding}Cache-Control: max-age=0\r\nContent-Length: 7\r\n\r\n{body}"
    )
}

/// A `304` cannot change what the stored body is for: its `Vary` stays the stored one, so
/// a gzip body refreshed by a 304 without `Vary: Accept-Encoding` is still not served to a
/// client that did not ask for gzip.
#[tokio::test]
async fn a_304_keeps_the_stored_vary() {
    let up = Scripted::start(gzip_then_304_without_its_vary).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let gzip = [("Accept-Encoding", "gzip")];
    assert_eq!(get(&mut c, "/v", &gzip).await.body, b"GZIPPED");
    let refreshed = get(&mut c, "/v", &gzip).await;
    assert_eq!(
        refreshed.header("Cache-Status"),
        Some("weir; fwd=stale; fwd-status=304")
    );
    let plain = get(&mut c, "/v", &[]).await;
    assert_eq!(plain.header("Content-Encoding"), None);
    assert_eq!(plain.body, b"plain!!");
}

/// Routes sharing a store do not wait for each other's fetch of a key: while beta's fetch
/// of `/hot` is held at its upstream, prod's miss of the same URL goes to prod at once.
#[tokio::test]
async fn routes_sharing_a_store_do_not_wait_for_each_other() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let beta = Scripted::gated(fresh_for_a_minute, Some(gate.clone())).await;
    let prod = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "prod");
    let store = "cache = { store = \"mem\", lock_timeout = \"60s\" }";
    let weir = beta_and_prod(store, beta.addr, prod.addr()).start();
    let addr = weir.addr;
    let held = tokio::spawn(async move {
        let mut c = Client::connect(addr).await.expect("connect");
        get(&mut c, "/hot", &[("X-Beta", "1")]).await.body
    });
    let at_beta = || beta.heads().len() == 1;
    assert!(weir_testkit::wait_until_async(std::time::Duration::from_secs(10), at_beta).await);
    let mut c = weir.client().await;
    // Before: prod's miss waited for beta's fetch (up to lock_timeout).
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), get(&mut c, "/hot", &[]))
        .await
        .expect("prod's miss waited for beta's fetch");
    assert_eq!(r.body, b"prod");
    gate.add_permits(1);
    assert_eq!(held.await.unwrap(), b"hot");
}

/// An entry keeps only the request fields its policy weighs (not a client's padding), and
/// it accounts for its heads: a large request field takes no room in a disk store's file,
/// a large response field counts in a memory store's bytes.
#[tokio::test]
async fn an_entry_keeps_and_counts_its_heads_not_the_requests_other_fields() {
    let pad = "p".repeat(7000);
    let dir = DiskDir::new("heads");
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "x");
    let weir = cached_in(b.addr(), "", &dir.store()).start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[("X-Pad", &pad), ("X-Pad", &pad)]).await;
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let bytes = weir.metric("weir_cache_bytes{store=\"mem\"}");
    assert!(bytes < 4000, "the padding is not stored: {bytes} bytes");

    let big = "b".repeat(10_000);
    let b = Backend::fixed(
        200,
        &[("Cache-Control", "max-age=60"), ("X-Big", &big)],
        "x",
    );
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", &[]).await;
    assert_eq!(r.header("X-Big").map(str::len), Some(10_000));
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let bytes = weir.metric("weir_cache_bytes{store=\"mem\"}");
    assert!(
        bytes > 10_000,
        "the response's head is counted: {bytes} bytes"
    );
}

/// Answers with the request's `Accept-Language` lines, joined, fresh for a minute, varying
/// on it.
fn languages(head: &str, _: usize) -> String {
    let asked: Vec<_> = head
        .lines()
        .filter_map(|l| l.strip_prefix("Accept-Language: "))
        .collect();
    let body = asked.join("+");
    format!(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nVary: Accept-Language\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A `Vary`-listed field sent on two lines is matched by both: a request sending only the
/// first does not get the entry stored for both.
#[tokio::test]
async fn a_varied_field_on_two_lines_is_matched_whole() {
    let up = Scripted::start(languages).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let two = [("Accept-Language", "en"), ("Accept-Language", "xx-evil")];
    assert_eq!(get(&mut c, "/", &two).await.body_str(), "en+xx-evil");
    let en = get(&mut c, "/", &[("Accept-Language", "en")]).await;
    assert_eq!(en.body_str(), "en");
    assert_eq!(en.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    let again = get(&mut c, "/", &two).await;
    assert_eq!(again.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(again.body_str(), "en+xx-evil");
    let joined = get(&mut c, "/", &[("Accept-Language", "en, xx-evil")]).await;
    assert_eq!(
        joined.header("Cache-Status"),
        Some("weir; hit"),
        "the same value"
    );
}

/// `ETag: "v1"`, stale at once, with two lines each of `Vary` and `Link`; a `304` to
/// `If-None-Match: "v1"` makes it fresh for a minute.
fn repeated_fields(head: &str, _: usize) -> String {
    let fields = "ETag: \"v1\"\r\nVary: Accept-Encoding\r\nVary: Accept-Language\r\n\
                  Link: <a>; rel=preload\r\nLink: <b>; rel=preload\r\n";
    if head.contains("If-None-Match: \"v1\"") {
        return "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n"
            .into();
    }
    format!("HTTP/1.1 200 OK\r\n{fields}Cache-Control: max-age=0\r\nContent-Length: 1\r\n\r\nv")
}

/// A hit carries every line of a repeated stored field, before and after a `304` refreshed
/// the entry, and the refreshed entry still varies on each field its `Vary` lines name.
#[tokio::test]
async fn repeated_response_fields_keep_every_line_through_a_refresh() {
    let up = Scripted::start(repeated_fields).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    let asks = [("Accept-Encoding", "gzip"), ("Accept-Language", "en")];
    get(&mut c, "/", &asks).await;
    let refreshed = get(&mut c, "/", &asks).await;
    let hit = get(&mut c, "/", &asks).await;
    for (what, r) in [("refreshed", &refreshed), ("hit", &hit)] {
        assert_eq!(r.headers_all("Vary").len(), 2, "{what}");
        assert_eq!(r.headers_all("Link").len(), 2, "{what}");
        assert_eq!(r.header("Cache-Control"), Some("max-age=60"), "{what}");
    }
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    // The same coding, another language: the second `Vary` line still counts.
    let other = [("Accept-Encoding", "gzip"), ("Accept-Language", "fr")];
    let other = get(&mut c, "/", &other).await;
    assert_ne!(
        other.header("Cache-Status"),
        Some("weir; hit"),
        "another variant"
    );
}

/// `ETag: "v1"` with only an `Expires` long past; a `304` that adds
/// `Cache-Control: private`; then `new`.
fn expired_then_private(head: &str, index: usize) -> String {
    match index {
        0 => "HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nExpires: Thu, 01 Jan 1970 00:00:00 GMT\r\n\
              Content-Length: 7\r\n\r\nversion"
            .into(),
        1 if head.contains("If-None-Match: \"v1\"") => {
            "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: private, max-age=100\r\n\r\n"
                .into()
        }
        _ => "HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 3\r\n\r\nnew".into(),
    }
}

/// A `304` that adds `private` to an entry stored without `Cache-Control` removes it.
#[tokio::test]
async fn a_304_that_adds_private_removes_the_entry() {
    let up = Scripted::start(expired_then_private).await;
    let weir = cached(up.addr, "", "").start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/", &[]).await.body, b"version");
    let refreshed = get(&mut c, "/", &[]).await;
    assert_eq!(refreshed.body, b"version");
    assert_eq!(
        refreshed.header("Cache-Control"),
        Some("private, max-age=100")
    );
    assert_eq!(weir.metric("weir_cache_entries{store=\"mem\"}"), 0);
    let after = get(&mut c, "/", &[]).await;
    assert_eq!(
        (after.body.as_slice(), after.header("Cache-Status")),
        (&b"new"[..], Some("weir; fwd=uri-miss"))
    );
}

/// A `204` hit has no `Content-Length` (RFC 9110 8.6), and the connection stays in step.
#[tokio::test]
async fn a_204_hit_has_no_content_length() {
    let b = Backend::fixed(204, &[("Cache-Control", "max-age=60")], "");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    for _ in 0..2 {
        let hit = get(&mut c, "/", &[]).await;
        assert_eq!(
            (hit.status, hit.header("Cache-Status")),
            (204, Some("weir; hit"))
        );
        assert_eq!(hit.header("Content-Length"), None);
    }
    assert_eq!(b.requests_served(), 1);
}

/// A range of a stored `200` that carries a `Content-Range` of its own has only the `206`'s.
#[tokio::test]
async fn a_range_hit_has_one_content_range() {
    let fields = [
        ("Cache-Control", "max-age=60"),
        ("Content-Range", "bytes 0-9/10"),
    ];
    let b = Backend::fixed(200, &fields, "0123456789");
    let weir = cached(b.addr(), "", "").start();
    let mut c = weir.client().await;
    get(&mut c, "/", &[]).await;
    let one = get(&mut c, "/", &[("Range", "bytes=2-4")]).await;
    assert_eq!((one.status, one.body.as_slice()), (206, &b"234"[..]));
    assert_eq!(one.headers_all("Content-Range"), ["bytes 2-4/10"]);
    let same = format!("bytes={}", vec!["0-0"; 32].join(","));
    let whole = get(&mut c, "/", &[("Range", &same)]).await;
    assert_eq!(
        (whole.status, whole.body.as_slice()),
        (200, &b"0123456789"[..])
    );
}
