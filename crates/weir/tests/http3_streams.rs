//! An HTTP/3 request stream while it waits for the upstream's final head: 1xx heads (103
//! Early Hints) from an HTTP/1.1 or HTTP/2 upstream reach the HTTP/3 client before the
//! final response, within the listener's `max_informational`; and a client whose
//! connection closes has its HTTP/2 upstream stream reset at once, not at the response
//! timeout.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::h3_client::{connect_limited, connect_to, get, ClientLimits};
use weir_testkit::{wait_until_async, Backend, H2Backend};

use common::{single, tls_table, Conf, Weir};

const NAME: &str = "h3.example.com";

fn start(conf: Conf, leaf: &Leaf) -> Weir {
    conf.listener("http3 = true")
        .listener(&tls_table(&[leaf], ""))
        .start()
}

/// Weir routing everything to the h2c `backend`, with a long response timeout.
fn to_h2c(backend: SocketAddr, leaf: &Leaf) -> Weir {
    let options = ["protocol = \"h2c\"", "response_timeout = \"60s\""];
    let conf = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend], &options);
    start(conf, leaf)
}

#[tokio::test]
async fn early_hints_from_an_http1_upstream_reach_the_h3_client() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::raw_response(
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let weir = start(single(backend.addr()), &leaf);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/page").await.expect("GET");
    assert_eq!(r.interims.len(), 1, "{:?}", r.interims);
    let (status, hints) = &r.interims[0];
    assert_eq!(*status, 103);
    assert_eq!(hints["link"], "</style.css>; rel=preload");
    for hop in ["connection", "x-hop"] {
        assert!(!hints.contains_key(hop), "{hop}: {hints:?}");
    }
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
}

#[tokio::test]
async fn early_hints_larger_than_the_clients_limit_are_skipped_and_cost_no_reset() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    // A 103 of about 2 KiB, to a client that takes heads of 1 KiB at most.
    let link = "</a.css>; rel=preload, ".repeat(100);
    let response = format!(
        "HTTP/1.1 103 Early Hints\r\nLink: {link}\r\n\r\n\
         HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    );
    let backend = Backend::raw_response(response.as_bytes());
    let conf = single(backend.addr()).listener("http2 = { reset_budget = 2 }");
    let weir = start(conf, &leaf);
    let limits = ClientLimits {
        max_field_section_size: Some(1024),
        ..ClientLimits::default()
    };
    let mut c = connect_limited(&ca, weir.addr, NAME, limits).await;
    // Past the reset budget, were each skipped head a reset: the connection stays.
    for _ in 0..5 {
        let r = get(&mut c.send, NAME, "/page").await.expect("GET");
        assert!(r.interims.is_empty(), "{:?}", r.interims);
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    }
    let resets = weir.metric("weir_http3_client_resets_total{listener=\"web\"}");
    assert_eq!(resets, 0);
}

#[tokio::test]
async fn a_1xx_head_cut_short_resets_its_stream_and_spares_the_connection() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    // A 103 of about 4 KiB, to a client that lets a stream have 1000 bytes unread.
    let link = "</a.css>; rel=preload, ".repeat(180);
    let response = format!(
        "HTTP/1.1 103 Early Hints\r\nLink: {link}\r\n\r\n\
         HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    );
    let backend = Backend::raw_response(response.as_bytes());
    let conf = single(backend.addr()).listener("http2 = { stall_timeout = \"1s\" }");
    let weir = start(conf, &leaf);
    let limits = ClientLimits {
        stream_window: Some(1000),
        ..ClientLimits::default()
    };
    let mut c = connect_limited(&ca, weir.addr, NAME, limits).await;
    // A response the client does not read: the 103 stops part-way for want of credit,
    // and after the stall timeout Weir gives the request up (and would answer 408).
    let req = Request::get(format!("https://{NAME}/stalled"))
        .body(())
        .expect("request");
    let mut stalled = c.send.send_request(req).await.expect("request");
    stalled.finish().await.expect("end of the request");
    let counted = || {
        let text = weir.metrics_text();
        let mut lines = text.lines();
        lines.any(|l| l.starts_with("weir_requests_total{") && l.contains("HTTP/3"))
    };
    // Generous: only a hang fails here (the stall timeout is 1 s).
    let given_up = wait_until_async(Duration::from_secs(20), counted).await;
    assert!(given_up, "the stalled request is over");
    // The stream was reset, so it ends in an error, not a truncated frame...
    let head = tokio::time::timeout(Duration::from_secs(10), stalled.recv_response()).await;
    assert!(matches!(head, Ok(Err(_))), "{head:?}");
    // ... and the connection, with every other stream on it, lives on.
    let r = get(&mut c.send, NAME, "/next").await.expect("GET");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
}

#[tokio::test]
async fn early_hints_from_an_h2_upstream_reach_the_h3_client_within_max_informational() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = H2Backend::h2c();
    let weir = to_h2c(backend.addr(), &leaf);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let r = get(&mut c.send, NAME, "/hints?n=2").await.expect("GET");
    let hints: Vec<_> = r
        .interims
        .iter()
        .map(|(s, h)| (*s, h["x-hint"].clone()))
        .collect();
    assert_eq!(
        hints,
        [(103, "0".parse().unwrap()), (103, "1".parse().unwrap())]
    );
    assert_eq!(r.status, 200);
    // Past max_informational (8), as for HTTP/2 clients: 8 relayed, then 502.
    let r = get(&mut c.send, NAME, "/hints?n=20").await.expect("GET");
    assert_eq!(r.interims.len(), 8, "{:?}", r.interims);
    assert_eq!(r.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_has_its_h2_upstream_stream_reset_at_once() {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = H2Backend::h2c();
    let weir = to_h2c(backend.addr(), &leaf);
    let c = connect_to(&ca, weir.addr, NAME).await;
    let mut send = c.send.clone();
    let waiting = tokio::spawn(async move { get(&mut send, NAME, "/hang").await });
    let arrived = wait_until_async(Duration::from_secs(10), || backend.streams() == 1).await;
    assert!(arrived, "the request reached the upstream");
    c.connection.close(0u32.into(), b"leaving");
    // Well before the 60 s response timeout: the wait ends when the connection closes.
    let reset = wait_until_async(Duration::from_secs(10), || backend.resets() == 1).await;
    assert!(reset, "the upstream stream is reset when the client leaves");
    waiting.abort();
}
