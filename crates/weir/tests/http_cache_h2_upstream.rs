//! The HTTP cache in front of an HTTP/2 upstream (`protocol = "h2c"`), over real sockets:
//! its responses are stored, collapsed and revalidated as an HTTP/1.1 upstream's are, for
//! HTTP/1.1 and HTTP/2 clients alike (a miss stored, then hits with no request upstream;
//! concurrent misses sending one request; a stale entry's conditional request, whose
//! `304` refreshes it; `stale-while-revalidate`: answered at once, refreshed, stored anew
//! or left as it was by one request in the background, which stops reading a body past
//! `max_object_size`).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::Conf;
use http::HeaderMap;
use tokio::sync::Semaphore;
use weir_testkit::{Client, Response};

/// What the scripted upstream answers the `index`-th request (from 0) with the fields
/// `fields`: status, fields, body.
type Script = fn(&HeaderMap, usize) -> (u16, Vec<(&'static str, &'static str)>, &'static str);

/// An h2c upstream answering as its script says, each request's fields kept; with a
/// gate, each answer waits for a permit.
struct ScriptedH2 {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

impl ScriptedH2 {
    async fn start(script: Script, gate: Option<Arc<Semaphore>>) -> ScriptedH2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (kept, gate) = (kept.clone(), gate.clone());
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        let (kept, gate) = (kept.clone(), gate.clone());
                        tokio::spawn(answer(
                            request.into_parts().0.headers,
                            respond,
                            script,
                            kept,
                            gate,
                        ));
                    }
                });
            }
        });
        ScriptedH2 { addr, seen }
    }

    /// The fields of each request received so far.
    fn requests(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(
    fields: HeaderMap,
    mut respond: h2::server::SendResponse<Bytes>,
    script: Script,
    kept: Arc<Mutex<Vec<HeaderMap>>>,
    gate: Option<Arc<Semaphore>>,
) {
    let (status, headers, body) = {
        let mut kept = kept.lock().unwrap();
        kept.push(fields.clone());
        script(&fields, kept.len() - 1)
    };
    if let Some(gate) = gate {
        gate.acquire().await.unwrap().forget();
    }
    let mut head = http::Response::builder().status(status);
    for (name, value) in headers {
        // HTTP/2's rule for names (lower case), which lets `"` through, as the h2 crate does.
        let name = http::HeaderName::from_lowercase(name.as_bytes()).expect("a lower-case name");
        head = head.header(name, value);
    }
    let empty = body.is_empty();
    let Ok(mut send) = respond.send_response(head.body(()).unwrap(), empty) else {
        return;
    };
    if !empty {
        let _ = send.send_data(Bytes::from_static(body.as_bytes()), true);
    }
}

/// Route `c` caching in the memory store `mem`, to the h2c upstream at `up`.
fn cached_h2c(up: SocketAddr) -> Conf {
    Conf::new()
        .route("c", "up", &["cache = { store = \"mem\" }"])
        .upstream("up", &[up], &["protocol = \"h2c\""])
        .table("[caches.mem]\nkind = \"memory\"")
}

async fn get(c: &mut Client, path: &str) -> Response {
    c.request("GET", path, &[("Host", "example.com")], b"")
        .await
        .expect("response")
}

/// An h2 request for `path`: its status, `cache-status` and body.
async fn h2_get(h2: &mut h2::client::SendRequest<Bytes>, path: &str) -> (u16, String, Vec<u8>) {
    let (status, headers, body) = common::h2_get(h2, path, &[]).await;
    let cache = headers
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, cache.unwrap_or_default(), body)
}

fn fresh_for_a_minute(
    _: &HeaderMap,
    _: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    (
        200,
        vec![("cache-control", "max-age=60"), ("x-up", "1")],
        "hello",
    )
}

/// A miss of each client protocol is stored; every later request of either protocol is
/// a hit, with no request upstream.
#[tokio::test]
async fn an_h2c_upstream_s_responses_are_stored_for_every_client() {
    let up = ScriptedH2::start(fresh_for_a_minute, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    let mut h2 = common::h2c_client(weir.addr).await;
    let first = get(&mut c, "/one").await;
    assert_eq!((first.status, first.body.as_slice()), (200, &b"hello"[..]));
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    let (status, cache, body) = h2_get(&mut h2, "/two").await;
    assert_eq!(
        (status, cache.as_str(), body.as_slice()),
        (200, "weir; fwd=uri-miss", &b"hello"[..])
    );
    assert_eq!(up.requests().len(), 2);
    for path in ["/one", "/two"] {
        let hit = get(&mut c, path).await;
        assert_eq!((hit.status, hit.body.as_slice()), (200, &b"hello"[..]));
        assert_eq!(hit.header("Cache-Status"), Some("weir; hit"), "{path}");
        assert_eq!(hit.header("X-Up"), Some("1"));
        let (status, cache, body) = h2_get(&mut h2, path).await;
        assert_eq!(
            (status, cache.as_str(), body.as_slice()),
            (200, "weir; hit", &b"hello"[..])
        );
    }
    assert_eq!(up.requests().len(), 2, "hits never reach the upstream");
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 2);
}

/// Concurrent misses of one key, from HTTP/1.1 connections and HTTP/2 streams: one
/// request reaches the upstream, the others are answered from what it stored.
#[tokio::test]
async fn concurrent_misses_to_an_h2c_upstream_send_one_request() {
    let gate = Arc::new(Semaphore::new(0));
    let up = ScriptedH2::start(fresh_for_a_minute, Some(gate.clone())).await;
    let weir = cached_h2c(up.addr).start();
    let h2 = common::h2c_client(weir.addr).await;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (addr, mut h2) = (weir.addr, h2.clone());
        requests.spawn(async move {
            if i % 2 == 0 {
                return h2_get(&mut h2, "/hot").await;
            }
            let mut c = Client::connect(addr).await.expect("connect");
            let r = get(&mut c, "/hot").await;
            (
                r.status,
                r.header("Cache-Status").unwrap_or_default().to_owned(),
                r.body,
            )
        });
    }
    weir.wait_metric("weir_cache_collapsed_waits_total{store=\"mem\"}", 39)
        .await;
    // The filler's request may still be on its way to the (gated) upstream.
    let reached = weir_testkit::wait_until_async(common::WAIT, || !up.requests().is_empty());
    assert!(reached.await, "the filler's request reaches the upstream");
    gate.add_permits(40);
    let mut statuses = Vec::new();
    while let Some(done) = requests.join_next().await {
        let (status, cache, body) = done.unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"hello"[..]));
        statuses.push(cache);
    }
    let count = |s: &str| statuses.iter().filter(|c| *c == s).count();
    assert_eq!(count("weir; fwd=uri-miss"), 1, "{statuses:?}");
    assert_eq!(count("weir; hit; collapsed"), 39, "{statuses:?}");
    assert_eq!(up.requests().len(), 1, "one request upstream for 40 misses");
}

/// `etag: "v1"`, stale at once: a `304` to `if-none-match: "v1"`.
fn etag_v1(fields: &HeaderMap, _: usize) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    if fields.get("if-none-match").is_some_and(|v| v == "\"v1\"") {
        return (
            304,
            vec![("etag", "\"v1\""), ("cache-control", "max-age=60")],
            "",
        );
    }
    (
        200,
        vec![("etag", "\"v1\""), ("cache-control", "max-age=0")],
        "version",
    )
}

/// A stale entry is revalidated with one conditional request; the upstream's `304`
/// refreshes it (a hit afterwards), for either client protocol.
#[tokio::test]
async fn an_h2c_upstream_s_304_refreshes_the_stale_entry() {
    let up = ScriptedH2::start(etag_v1, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    let mut h2 = common::h2c_client(weir.addr).await;
    // An HTTP/1.1 client's entry, revalidated by an HTTP/1.1 client, then an HTTP/2
    // client's entry revalidated by an HTTP/2 client.
    let first = get(&mut c, "/r1").await;
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    let second = get(&mut c, "/r1").await;
    assert_eq!(
        (second.status, second.body.as_slice()),
        (200, &b"version"[..])
    );
    assert_eq!(
        second.header("Cache-Status"),
        Some("weir; fwd=stale; fwd-status=304")
    );
    assert_eq!(
        second.header("Cache-Control"),
        Some("max-age=60"),
        "the 304's fields are stored"
    );
    let (_, cache, _) = h2_get(&mut h2, "/r2").await;
    assert_eq!(cache, "weir; fwd=uri-miss");
    let (status, cache, body) = h2_get(&mut h2, "/r2").await;
    assert_eq!(
        (status, cache.as_str(), body.as_slice()),
        (200, "weir; fwd=stale; fwd-status=304", &b"version"[..])
    );
    for path in ["/r1", "/r2"] {
        assert_eq!(
            get(&mut c, path).await.header("Cache-Status"),
            Some("weir; hit")
        );
        assert_eq!(h2_get(&mut h2, path).await.1, "weir; hit");
    }
    let requests = up.requests();
    assert_eq!(requests.len(), 4, "{requests:?}");
    let conditional = |i: usize| {
        requests[i]
            .get("if-none-match")
            .map(|v| v.to_str().unwrap())
    };
    assert_eq!(
        (0..4).map(conditional).collect::<Vec<_>>(),
        [None, Some("\"v1\""), None, Some("\"v1\"")]
    );
}

/// An HTTP/3 client's miss to an h2c upstream is stored as well: the next request is a
/// hit, with no request upstream.
#[tokio::test]
async fn an_http3_client_s_miss_to_an_h2c_upstream_is_stored() {
    use weir_testkit::certs::TestCa;
    use weir_testkit::h3_client::{connect_to, get};
    const NAME: &str = "h3.example.com";
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let up = ScriptedH2::start(fresh_for_a_minute, None).await;
    let weir = cached_h2c(up.addr)
        .listener("http3 = true")
        .listener(&common::tls_table(&[&leaf], ""))
        .start();
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    for expected in ["weir; fwd=uri-miss", "weir; hit"] {
        let r = get(&mut c.send, NAME, "/q").await.expect("GET");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        assert_eq!(r.header("cache-status"), Some(expected));
    }
    assert_eq!(up.requests().len(), 1, "the hit never reaches the upstream");
}

/// Stale at once, and may answer for an error for a minute; the upstream fails (503)
/// from its second request on.
fn then_failing(
    _: &HeaderMap,
    index: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    match index {
        0 => (
            200,
            vec![("cache-control", "max-age=0, stale-if-error=60")],
            "kept",
        ),
        _ => (503, vec![], "down"),
    }
}

/// An h2c upstream's 5xx is answered with the stale entry it stored, when the entry
/// allows it (`stale-if-error`), for either client protocol.
#[tokio::test]
async fn a_stale_entry_answers_for_an_h2c_upstream_s_5xx() {
    let up = ScriptedH2::start(then_failing, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/s").await.body, b"kept");
    let stale = get(&mut c, "/s").await;
    assert_eq!((stale.status, stale.body.as_slice()), (200, &b"kept"[..]));
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale")
    );
    let mut h2 = common::h2c_client(weir.addr).await;
    let (status, cache, body) = h2_get(&mut h2, "/s").await;
    assert_eq!(
        (status, cache.as_str(), body.as_slice()),
        (200, "weir; hit; detail=stale", &b"kept"[..])
    );
    assert_eq!(up.requests().len(), 3);
}

/// An HTTP/1.x client's miss to an h2c upstream that is gone (a connection error, no
/// response) is answered with the stale entry its `stale-if-error` allows: the fill the
/// HTTP/2 sender held is the request's again once the tries are over.
#[tokio::test]
async fn a_stale_entry_answers_an_http1_client_when_the_h2c_upstream_is_gone() {
    let up = ScriptedH2::start(then_failing, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/g").await.body, b"kept");
    drop(up);
    let mut c = weir.client().await;
    let stale = get(&mut c, "/g").await;
    assert_eq!((stale.status, stale.body.as_slice()), (200, &b"kept"[..]));
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale")
    );
}

fn with_a_name_http1_refuses(
    _: &HeaderMap,
    _: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    (
        200,
        vec![("cache-control", "max-age=60"), ("x\"y", "1")],
        "quoted",
    )
}

/// A response whose field name HTTP/2 lets through but HTTP/1.1 refuses (`x"y`) is not
/// stored: every hit's head is parsed again as HTTP/1.1 and would fail (it was stored,
/// and each later request of the key failed until it expired).
#[tokio::test]
async fn a_response_with_a_name_http1_refuses_is_not_stored() {
    let up = ScriptedH2::start(with_a_name_http1_refuses, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut h2 = common::h2c_client(weir.addr).await;
    for _ in 0..2 {
        let (status, cache, body) = h2_get(&mut h2, "/q").await;
        assert_eq!(
            (status, cache.as_str(), body.as_slice()),
            (200, "weir; fwd=uri-miss", &b"quoted"[..])
        );
    }
    assert_eq!(up.requests().len(), 2);
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 0);
}

/// `etag: "v1"`, stale at once but for `stale-while-revalidate=60`: a `304` (fresh for a
/// minute) to `if-none-match: "v1"`.
fn etag_v1_swr(
    fields: &HeaderMap,
    _: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    if fields.get("if-none-match").is_some_and(|v| v == "\"v1\"") {
        return (
            304,
            vec![("etag", "\"v1\""), ("cache-control", "max-age=60")],
            "",
        );
    }
    let swr = "max-age=0, stale-while-revalidate=60";
    (
        200,
        vec![("etag", "\"v1\""), ("cache-control", swr)],
        "version",
    )
}

/// `stale-while-revalidate` toward an h2c upstream: a stale entry within its window
/// answers at once (HTTP/1.1 and HTTP/2 clients alike, the upstream held), one
/// conditional request goes up in the background whatever the number of requests, and its
/// `304` refreshes the entry for the next request.
#[tokio::test]
async fn a_stale_while_revalidate_entry_is_refreshed_in_the_background_over_h2c() {
    // One permit: the first request's answer; the background one waits for the next.
    let gate = Arc::new(Semaphore::new(1));
    let up = ScriptedH2::start(etag_v1_swr, Some(gate.clone())).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    let mut h2 = common::h2c_client(weir.addr).await;
    let first = get(&mut c, "/").await;
    assert_eq!(first.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    let swr = "weir; hit; detail=stale-while-revalidate";
    for _ in 0..10 {
        // Bounded only so that a request waiting for the held upstream fails the test
        // instead of hanging it.
        let at_once = tokio::time::timeout(common::WAIT, get(&mut c, "/"));
        let r = at_once.await.expect("answered without the upstream");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"version"[..]));
        assert_eq!(r.header("Cache-Status"), Some(swr));
        assert!(r.header("Age").is_some());
        let at_once = tokio::time::timeout(common::WAIT, h2_get(&mut h2, "/"));
        let (status, cache, body) = at_once.await.expect("answered without the upstream");
        assert_eq!(
            (status, cache.as_str(), body.as_slice()),
            (200, swr, &b"version"[..])
        );
    }
    assert_eq!(
        weir.metric("weir_cache_revalidations_total{store=\"mem\"}"),
        1
    );
    assert!(up.requests().len() <= 2, "one revalidation");
    gate.add_permits(1);
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    let refreshed = get(&mut c, "/").await;
    assert_eq!(refreshed.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(refreshed.header("Cache-Control"), Some("max-age=60"));
    assert_eq!(refreshed.body, b"version");
    let requests = up.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(
        requests[1]
            .get("if-none-match")
            .map(|v| v.to_str().unwrap()),
        Some("\"v1\"")
    );
}

/// No validator: `old` (stale at once but for `stale-while-revalidate=60`), then `new`.
fn old_then_new(
    _: &HeaderMap,
    index: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    match index {
        0 => (
            200,
            vec![("cache-control", "max-age=0, stale-while-revalidate=60")],
            "old",
        ),
        _ => (200, vec![("cache-control", "max-age=60")], "new"),
    }
}

/// A stale entry without a validator is fetched again from the h2c upstream in the
/// background, unconditionally, and the new response replaces it.
#[tokio::test]
async fn a_background_revalidation_over_h2c_stores_a_new_response() {
    let up = ScriptedH2::start(old_then_new, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut h2 = common::h2c_client(weir.addr).await;
    assert_eq!(h2_get(&mut h2, "/n").await.2, b"old");
    let (_, cache, body) = h2_get(&mut h2, "/n").await;
    assert_eq!(
        (cache.as_str(), body.as_slice()),
        ("weir; hit; detail=stale-while-revalidate", &b"old"[..])
    );
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 2)
        .await;
    let (_, cache, body) = h2_get(&mut h2, "/n").await;
    assert_eq!(
        (cache.as_str(), body.as_slice()),
        ("weir; hit", &b"new"[..])
    );
    let requests = up.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests[1].get("if-none-match").is_none());
}

/// Stale at once, for a minute while revalidated and on an error; the upstream fails
/// (503) from its second request on.
fn swr_then_failing(
    _: &HeaderMap,
    index: usize,
) -> (u16, Vec<(&'static str, &'static str)>, &'static str) {
    let cc = "max-age=0, stale-while-revalidate=60, stale-if-error=60";
    match index {
        0 => (200, vec![("etag", "\"k\""), ("cache-control", cc)], "kept"),
        _ => (503, vec![], "down"),
    }
}

/// A background revalidation's 5xx leaves the entry as it was: nobody is answered
/// instead (no stale answer counted for it), and the next request is answered stale
/// again and revalidates again.
#[tokio::test]
async fn a_background_revalidation_s_5xx_over_h2c_leaves_the_entry() {
    let up = ScriptedH2::start(swr_then_failing, None).await;
    let weir = cached_h2c(up.addr).start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/f").await.body, b"kept");
    let swr = Some("weir; hit; detail=stale-while-revalidate");
    let failed = format!(
        "weir_upstream_requests_total{{upstream=\"up\",server=\"{}\",code=\"503\"}}",
        up.addr
    );
    for round in 1..=2 {
        let stale = get(&mut c, "/f").await;
        assert_eq!((stale.status, stale.body.as_slice()), (200, &b"kept"[..]));
        assert_eq!(stale.header("Cache-Status"), swr);
        // Counted once the background fetch has weighed the 503.
        weir.wait_metric(&failed, round).await;
    }
    // The 503s were answered by nobody: only the two clients' stale answers count.
    let stale = "weir_cache_stale_total{store=\"mem\"}";
    assert_eq!(weir.metric(stale), 2);
    assert_eq!(weir.metric("weir_cache_stored_total{store=\"mem\"}"), 1);
    assert_eq!(up.requests().len(), 3);
}

/// An h2c upstream whose second response (the background revalidation's, fresh for a
/// minute) is a body that never ends, 512 bytes every 20 ms; its other responses are
/// `old`, stale at once but for `stale-while-revalidate=60`. Returns its address,
/// whether that endless stream was reset by Weir, and the connections it accepted.
async fn endless_second() -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (count, reset) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (was_reset, accepted) = (reset.clone(), Arc::new(AtomicUsize::new(0)));
    let connections = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            accepted.fetch_add(1, SeqCst);
            let (count, reset) = (count.clone(), reset.clone());
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((_, mut respond))) = conn.accept().await {
                    let endless = count.fetch_add(1, SeqCst) == 1;
                    let cc = match endless {
                        true => "max-age=60",
                        false => "max-age=0, stale-while-revalidate=60",
                    };
                    let head = http::Response::builder().header("cache-control", cc);
                    let Ok(mut send) = respond.send_response(head.body(()).unwrap(), false) else {
                        continue;
                    };
                    if !endless {
                        let _ = send.send_data(Bytes::from_static(b"old"), true);
                        continue;
                    }
                    let reset = reset.clone();
                    tokio::spawn(async move {
                        let piece = Bytes::from(vec![b'x'; 512]);
                        while send.send_data(piece.clone(), false).is_ok() {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                        reset.store(true, SeqCst);
                    });
                }
            });
        }
    });
    (addr, was_reset, connections)
}

/// A background revalidation over h2c stops reading a body once it is over the store's
/// `max_object_size` (its stream reset), though no read ever waits `response_timeout`:
/// the key is let go at once, and a request that must revalidate first (`Cache-Control:
/// no-cache`) goes upstream then, not after the minute-long `response_timeout` or
/// `lock_timeout`.
#[tokio::test]
async fn a_background_revalidation_over_h2c_stops_past_max_object_size() {
    let (addr, reset, connections) = endless_second().await;
    let weir = Conf::new()
        .route(
            "c",
            "up",
            &["cache = { store = \"mem\", lock_timeout = \"60s\" }"],
        )
        .upstream(
            "up",
            &[addr],
            &["protocol = \"h2c\"", "response_timeout = \"60s\""],
        )
        .table("[caches.mem]\nkind = \"memory\"\nmax_object_size = \"4KiB\"")
        .start();
    let mut c = weir.client().await;
    assert_eq!(get(&mut c, "/").await.body, b"old");
    let stale = get(&mut c, "/").await;
    assert_eq!(
        stale.header("Cache-Status"),
        Some("weir; hit; detail=stale-while-revalidate")
    );
    let stopped = weir_testkit::wait_until_async(common::WAIT, || {
        reset.load(std::sync::atomic::Ordering::SeqCst)
    });
    assert!(stopped.await, "the endless stream is reset");
    assert_eq!(
        weir.metric("weir_cache_stored_total{store=\"mem\"}"),
        1,
        "nothing of it stored"
    );
    let at = std::time::Instant::now();
    let revalidated = c
        .request(
            "GET",
            "/",
            &[("Host", "example.com"), ("Cache-Control", "no-cache")],
            b"",
        )
        .await
        .expect("response");
    assert_eq!(revalidated.body, b"old");
    // Without the stop this waits the whole lock_timeout (60 s); the bound is generous
    // for a loaded machine but far below it.
    assert!(
        at.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        at.elapsed()
    );
    // Only the stream was reset: the pooled connection served the next request.
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}
