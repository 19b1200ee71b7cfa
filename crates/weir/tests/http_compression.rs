//! Response compression (`compression` on a route) over real sockets, HTTP/1.1 clients:
//! negotiation, the responses never compressed, the head edits (Vary, weak ETag, no
//! Content-Length), bodies that decode to the original for every algorithm at every
//! piece size an upstream writes with every framing, streaming flushes, and metrics.

mod common;
mod compression_support;

use common::Conf;
use compression_support::{decode, PieceBackend, Reply, TEXT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_testkit::{Backend, Client};

/// Route `c` on `/` with `compression = { keys }`, to `backend`.
fn compressing(backend: std::net::SocketAddr, keys: &str) -> Conf {
    Conf::new()
        .route("c", "up", &[&format!("compression = {{ {keys} }}")])
        .upstream("up", &[backend], &[])
}

async fn get(c: &mut Client, path: &str, accept: &str) -> weir_testkit::Response {
    let mut headers = vec![("Host", "h")];
    if !accept.is_empty() {
        headers.push(("Accept-Encoding", accept));
    }
    c.request("GET", path, &headers, b"")
        .await
        .expect("response")
}

#[tokio::test]
async fn every_algorithm_decodes_to_the_original_at_every_piece_size_and_framing() {
    let b = PieceBackend::start();
    let weir = compressing(b.addr, r#"min_size = "100""#).start();
    let body = TEXT.repeat(40);
    for algorithm in ["gzip", "br", "zstd"] {
        for framing in ["length", "chunked", "close"] {
            for piece in [1, 2, 3, 7, 64, 1000, 0] {
                b.set(Reply::ok("text/plain", &body, framing, piece));
                let mut c = weir.client().await;
                let r = get(&mut c, "/", algorithm).await;
                let what = format!("{algorithm} {framing} in {piece}-byte pieces");
                assert_eq!(r.status, 200, "{what}");
                assert_eq!(r.header("Content-Encoding"), Some(algorithm), "{what}");
                assert_eq!(r.header("Transfer-Encoding"), Some("chunked"), "{what}");
                assert_eq!(r.header("Content-Length"), None, "{what}");
                assert_eq!(r.headers_all("Vary"), vec!["Accept-Encoding"], "{what}");
                assert_eq!(decode(algorithm, &r.body), body.as_bytes(), "{what}");
                // Each upstream read is flushed: tiny pieces read one by one (timing) cost a
                // flush block each, so the ratio is only checked for whole-ish reads.
                if piece == 0 || piece >= 64 {
                    assert!(r.body.len() < body.len() / 4, "{what}: compressed");
                }
                // The client connection stays usable after a close-delimited upstream.
                let again = get(&mut c, "/", "").await;
                assert_eq!(again.body, body.as_bytes(), "{what}: identity next");
            }
        }
    }
}

#[tokio::test]
async fn gzip_decodes_with_the_upstream_response_split_at_every_byte() {
    let b = PieceBackend::start();
    let weir = compressing(b.addr, r#"min_size = "10", algorithms = ["gzip"]"#).start();
    let body = &TEXT[..400];
    for framing in ["length", "chunked", "close"] {
        let whole = Reply::ok("application/json", body, framing, 0);
        for at in 1..whole.bytes.len() {
            b.set(Reply {
                split_at: Some(at),
                ..whole.clone()
            });
            let mut c = weir.client().await;
            let r = get(&mut c, "/", "gzip").await;
            assert_eq!(
                r.header("Content-Encoding"),
                Some("gzip"),
                "{framing} at {at}"
            );
            assert_eq!(
                decode("gzip", &r.body),
                body.as_bytes(),
                "{framing} at {at}"
            );
        }
    }
}

#[tokio::test]
async fn negotiation_honours_q_values_star_identity_and_route_order() {
    let b = PieceBackend::start();
    b.set(Reply::ok("text/html", &TEXT.repeat(40), "length", 0));
    let weir = compressing(b.addr, r#"algorithms = ["br", "gzip"]"#).start();
    let mut c = weir.client().await;
    for (accept, want) in [
        ("gzip, br", Some("br")),
        ("gzip, br;q=0.9", Some("gzip")),
        ("gzip;q=0, br;q=0", None),
        ("zstd", None),
        ("*", Some("br")),
        ("br;q=0, *", Some("gzip")),
        ("*;q=0", None),
        ("gzip;q=0.5, identity", None),
        ("", None),
    ] {
        let r = get(&mut c, "/", accept).await;
        assert_eq!(r.header("Content-Encoding"), want, "{accept:?}");
        // Vary whether or not this client got a compressed body.
        assert_eq!(r.headers_all("Vary"), vec!["Accept-Encoding"], "{accept:?}");
        let plain = match want {
            Some(algorithm) => decode(algorithm, &r.body),
            None => r.body.clone(),
        };
        assert_eq!(plain, TEXT.repeat(40).as_bytes(), "{accept:?}");
    }
}

#[tokio::test]
async fn responses_that_are_never_compressed() {
    let b = PieceBackend::start();
    let weir = compressing(b.addr, r#"types = ["text/*"]"#).start();
    let big = TEXT.repeat(40);
    let with = |status: &str, headers: &str, body: &str| Reply::raw(status, headers, body);
    let cases = [
        (
            "encoded",
            with(
                "200 OK",
                "Content-Type: text/plain\r\nContent-Encoding: br\r\n",
                &big,
            ),
            false,
        ),
        (
            "range 206",
            with(
                "206 Partial Content",
                "Content-Type: text/plain\r\nContent-Range: bytes 0-1999/9000\r\n",
                &big,
            ),
            true,
        ),
        (
            "content-range",
            with(
                "200 OK",
                "Content-Type: text/plain\r\nContent-Range: bytes 0-1999/9000\r\n",
                &big,
            ),
            true,
        ),
        (
            "no-transform",
            with(
                "200 OK",
                "Content-Type: text/plain\r\nCache-Control: max-age=5, no-transform\r\n",
                &big,
            ),
            false,
        ),
        (
            "type",
            with("200 OK", "Content-Type: application/json\r\n", &big),
            false,
        ),
        ("no type", with("200 OK", "", &big), false),
        (
            "short",
            with("200 OK", "Content-Type: text/plain\r\n", &TEXT[..1000]),
            true,
        ),
    ];
    let mut c = weir.client().await;
    for (what, reply, vary) in cases {
        let body = reply.body.clone();
        b.set(reply);
        let r = get(&mut c, "/", "gzip, br, zstd").await;
        assert_eq!(
            r.headers_all("Content-Encoding").len(),
            usize::from(what == "encoded"),
            "{what}"
        );
        assert_eq!(
            r.header("Content-Length"),
            Some(&*body.len().to_string()),
            "{what}"
        );
        assert_eq!(r.body, body.as_bytes(), "{what}");
        let want: Vec<&str> = if vary {
            vec!["Accept-Encoding"]
        } else {
            vec![]
        };
        assert_eq!(r.headers_all("Vary"), want, "{what}");
    }
    for (status, bodiless) in [("204 No Content", true), ("304 Not Modified", true)] {
        b.set(with(status, "Content-Type: text/plain\r\n", ""));
        let r = get(&mut c, "/", "gzip").await;
        assert_eq!(r.header("Content-Encoding"), None, "{status}");
        assert!(bodiless && r.body.is_empty());
    }
    b.set(Reply::ok("text/plain", &big, "length", 0));
    let r = c
        .request(
            "HEAD",
            "/",
            &[("Host", "h"), ("Accept-Encoding", "gzip")],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(r.header("Content-Encoding"), None, "HEAD");
    assert_eq!(
        r.header("Content-Length"),
        Some(&*big.len().to_string()),
        "HEAD"
    );
}

#[tokio::test]
async fn compressed_head_weakens_etag_drops_ranges_and_merges_vary() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    b.set(Reply::raw(
        "200 OK",
        "Content-Type: text/css\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nVary: Origin\r\n",
        &big,
    ));
    let weir = compressing(b.addr, "").start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "zstd").await;
    assert_eq!(r.header("Content-Encoding"), Some("zstd"));
    assert_eq!(r.headers_all("ETag"), vec!["W/\"v1\""]);
    assert_eq!(r.header("Accept-Ranges"), None);
    assert_eq!(r.headers_all("Vary"), vec!["Origin", "Accept-Encoding"]);
    assert_eq!(decode("zstd", &r.body), big.as_bytes());
    // Identity keeps the strong validator and range support.
    let r = get(&mut c, "/", "identity").await;
    assert_eq!(r.headers_all("ETag"), vec!["\"v1\""]);
    assert_eq!(r.header("Accept-Ranges"), Some("bytes"));
    // The upstream already varies on Accept-Encoding: no second Vary.
    b.set(Reply::raw(
        "200 OK",
        "Content-Type: text/css\r\nVary: accept-encoding\r\n",
        &big,
    ));
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.headers_all("Vary"), vec!["accept-encoding"]);
}

#[tokio::test]
async fn http10_clients_get_identity_with_vary() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    b.set(Reply::ok("text/plain", &big, "chunked", 100));
    let weir = compressing(b.addr, "").start();
    let raw = weir_testkit::send_raw_once(
        weir.addr,
        b"GET / HTTP/1.0\r\nHost: h\r\nAccept-Encoding: gzip\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, body) = common::split_head(&raw);
    assert!(
        !head.to_ascii_lowercase().contains("content-encoding"),
        "{head}"
    );
    assert!(head.contains("Vary: Accept-Encoding"), "{head}");
    assert_eq!(body, big.as_bytes());
}

#[tokio::test]
async fn each_upstream_read_is_flushed_to_the_client() {
    let b = PieceBackend::start();
    let weir = compressing(b.addr, r#"min_size = "0", algorithms = ["gzip"]"#).start();
    for framing in ["chunked", "close"] {
        let (first, rest) = ("data: first event\n\n", "data: second event\n\n");
        let gate = b.set_gated(
            Reply::ok("text/event-stream", &format!("{first}{rest}"), framing, 0),
            first.len(),
        );
        let mut c = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
        c.write_all(b"GET /events HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let mut read_some = async || {
            let read = tokio::time::timeout(common::WAIT, c.read(&mut buf)).await;
            let n = read.expect("the event arrives (flushed)").expect("read");
            buf[..n].to_vec()
        };
        // The upstream holds the rest back until the client has decoded the first event.
        let mut stream = compression_support::ChunkedGzip::default();
        while !stream.decoded().ends_with(first.as_bytes()) {
            stream.feed(&read_some().await);
        }
        assert_eq!(stream.decoded(), first.as_bytes(), "{framing}");
        gate.send(()).unwrap();
        while !stream.ended() {
            stream.feed(&read_some().await);
        }
        assert_eq!(
            stream.decoded(),
            format!("{first}{rest}").as_bytes(),
            "{framing}"
        );
    }
}

#[tokio::test]
async fn compression_bytes_are_counted_per_route_and_algorithm() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    b.set(Reply::ok("text/plain", &big, "length", 0));
    let weir = compressing(b.addr, r#"algorithms = ["gzip", "br"]"#).start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "gzip").await;
    let sent = r.body.len();
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.body.len(), sent);
    let series = |dir: &str, alg: &str| {
        format!(
            "weir_compression_bytes_total{{listener=\"web\",route=\"c\",algorithm=\"{alg}\",direction=\"{dir}\"}} "
        )
    };
    let value = |text: &str, prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse::<usize>().ok())
    };
    // Requests are counted just after their answer is written.
    let counted = weir_testkit::wait_until(common::WAIT, || {
        value(&weir.metrics_text(), &series("in", "gzip")) == Some(2 * big.len())
    });
    let text = weir.metrics_text();
    assert!(counted, "{text}");
    assert_eq!(value(&text, &series("out", "gzip")), Some(2 * sent));
    assert_eq!(value(&text, &series("in", "br")), Some(0));
}

#[tokio::test]
async fn a_reload_turns_compression_on_and_off() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    b.set(Reply::ok("text/plain", &big, "length", 0));
    let plain = Conf::new()
        .route("c", "up", &[])
        .upstream("up", &[b.addr], &[]);
    let weir = plain.start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.header("Content-Encoding"), None);
    assert_eq!(r.header("Vary"), None);
    let on = compressing(b.addr, r#"algorithms = ["gzip"]"#).toml();
    weir.apply_text(&on).expect("apply");
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), big.as_bytes());
    weir.apply_text(&plain.toml()).expect("apply");
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.header("Content-Encoding"), None);
    assert_eq!(r.body, big.as_bytes());
}

/// A route whose `response_headers` set or remove Vary and ETag: the upstream's fields
/// are gone, so Weir adds its own `Vary: Accept-Encoding` and weakens no dropped ETag.
#[tokio::test]
async fn header_rules_that_drop_vary_or_etag_are_honoured() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    let upstream = "Content-Type: text/css\r\nETag: \"v1\"\r\nVary: Accept-Encoding\r\n";
    b.set(Reply::raw("200 OK", upstream, &big));
    let rules = [
        r#"response_headers = { set = { "Vary" = "Origin", "ETag" = "\"mine\"" } }"#,
        r#"response_headers = { remove = ["etag", "vary"] }"#,
    ];
    for (rule, etags, varies) in [
        (
            rules[0],
            vec!["\"mine\""],
            vec!["Origin", "Accept-Encoding"],
        ),
        (rules[1], vec![], vec!["Accept-Encoding"]),
    ] {
        let weir = Conf::new()
            .route("c", "up", &["compression = { }", rule])
            .upstream("up", &[b.addr], &[])
            .start();
        let mut c = weir.client().await;
        let r = get(&mut c, "/", "gzip").await;
        assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{rule}");
        assert_eq!(r.headers_all("ETag"), etags, "{rule}");
        assert_eq!(r.headers_all("Vary"), varies, "{rule}");
        assert_eq!(decode("gzip", &r.body), big.as_bytes(), "{rule}");
    }
}

/// `Content-Encoding: identity` and the digests of the uncompressed bytes are not sent
/// with a compressed body.
#[tokio::test]
async fn identity_coding_and_digests_of_the_uncompressed_body_are_dropped() {
    let b = PieceBackend::start();
    let big = TEXT.repeat(40);
    b.set(Reply::raw(
        "200 OK",
        "Content-Type: text/css\r\nContent-Encoding: identity\r\nContent-Digest: sha-256=:AAAA:\r\nRepr-Digest: sha-256=:AAAA:\r\nContent-MD5: Q2hlY2sgSW50ZWdyaXR5IQ==\r\n",
        &big,
    ));
    let weir = compressing(b.addr, "").start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "br").await;
    assert_eq!(r.headers_all("Content-Encoding"), vec!["br"]);
    for name in ["Content-Digest", "Repr-Digest", "Content-MD5"] {
        assert_eq!(r.header(name), None, "{name}");
    }
    assert_eq!(decode("br", &r.body), big.as_bytes());
    // Identity passes them through.
    let r = get(&mut c, "/", "identity").await;
    assert_eq!(r.header("Content-Digest"), Some("sha-256=:AAAA:"));
}

/// A 304 to a client that negotiated a coding carries the ETag weakened, as the 200 did.
#[tokio::test]
async fn a_304_carries_the_etag_the_compressed_200_had() {
    let b = PieceBackend::start();
    b.set(Reply::raw("304 Not Modified", "ETag: \"v1\"\r\n", ""));
    let weir = compressing(b.addr, "").start();
    let mut c = weir.client().await;
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.status, 304);
    assert_eq!(r.headers_all("ETag"), vec!["W/\"v1\""]);
    let r = get(&mut c, "/", "").await;
    assert_eq!(r.headers_all("ETag"), vec!["\"v1\""]);
}

/// A compressed chunked response keeps its trailer section (re-framed with the compressed
/// chunks), less what its head lost (the digests of the uncompressed body) and what no
/// trailer may carry; uncompressed, its digest is the body's own and is kept.
#[tokio::test]
async fn a_compressed_responses_trailers_lose_what_its_head_lost() {
    let body = TEXT.repeat(40);
    let raw = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\nContent-Digest: sha-256=:AAAA=:\r\nHost: evil.test\r\n\
         X-Kept: 2\r\n\r\n",
        body.len()
    );
    let b = Backend::raw_response(raw.as_bytes());
    let weir = compressing(b.addr(), r#"min_size = "100""#).start();
    let mut c = weir.client().await;
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    let r = get(&mut c, "/", "gzip").await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), body.as_bytes());
    assert_eq!(r.trailers, [pair("X-Kept", "2")]);
    let r = get(&mut c, "/", "").await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, body.as_bytes());
    let digest = pair("Content-Digest", "sha-256=:AAAA=:");
    assert_eq!(r.trailers, [digest, pair("X-Kept", "2")]);
}
