//! The HTTP cache's bounds over real sockets (attacker review): the memory in-flight fills
//! hold together (`max_fill_memory`), responses varying on a field Weir writes upstream
//! (never stored), and a disk store's index (`index_size`).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::{Conf, DiskDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use weir_testkit::{Backend, Client, Response};

async fn get(c: &mut Client, path: &str) -> Response {
    let host = [("Host", "example.com")];
    c.request("GET", path, &host, b"").await.expect("response")
}

/// An upstream answering every request with a fresh `len`-byte body, except `/slow`: its
/// head says `len + 40_000` bytes, `len` of them come at once and the rest once `go` is
/// notified.
async fn stalling(len: usize, go: Arc<Notify>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer_stalling(s, len, go.clone()));
        }
    });
    addr
}

/// [`stalling`]'s answers on one connection.
async fn answer_stalling(mut s: tokio::net::TcpStream, len: usize, go: Arc<Notify>) {
    let mut buf = Vec::new();
    while let Some(slow) = next_request(&mut s, &mut buf).await {
        let total = len + if slow { 40_000 } else { 0 };
        let head = format!(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: {total}\r\n\r\n"
        );
        let mut out = head.into_bytes();
        out.resize(out.len() + len, b'x');
        if s.write_all(&out).await.is_err() {
            return;
        }
        if slow {
            go.notified().await;
            if s.write_all(&[b'y'; 40_000]).await.is_err() {
                return;
            }
        }
    }
}

/// Reads the next request head on `s` (`buf`: what was read past the last one); whether it
/// asks for `/slow`. `None`: the connection ended.
async fn next_request(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<bool> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let slow = buf.starts_with(b"GET /slow ");
            buf.drain(..end + 4);
            return Some(slow);
        }
        let mut more = [0u8; 4096];
        let n = s.read(&mut more).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&more[..n]);
    }
}

/// A memory store `mem` on route `c` to `backend`, started.
fn memory_store(backend: SocketAddr) -> common::Weir {
    Conf::new()
        .route("c", "up", &["cache = { store = \"mem\" }"])
        .upstream("up", &[backend], &[])
        .table("[caches.mem]\nkind = \"memory\"")
        .start()
}

/// Waits until the series `series` reads at least `floor`.
async fn metric_at_least(weir: &common::Weir, series: &str, floor: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while weir.metric_now(series).unwrap_or(0) < floor {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} stays under {floor} in\n{}",
            weir.metrics_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fill whose upstream stalls holds its recorded body; another miss that would take the
/// store's fills past `max_fill_memory` streams to its client whole and is not stored
/// (counted), and the stalled one is stored once it completes, its memory let go.
#[tokio::test]
async fn fills_in_flight_stay_within_max_fill_memory() {
    let go = Arc::new(Notify::new());
    let addr = stalling(60_000, go.clone()).await;
    let weir = Conf::new()
        .route("c", "up", &["cache = { store = \"mem\" }"])
        .upstream("up", &[addr], &[])
        .table(
            "[caches.mem]\nkind = \"memory\"\nmax_size = \"1MiB\"\n\
             max_object_size = \"100KiB\"\nmax_fill_memory = \"100KiB\"",
        )
        .start();
    let filling = "weir_cache_fill_bytes{store=\"mem\"}";
    let mut slow = weir.client().await;
    let stalled = tokio::spawn(async move {
        let r = get(&mut slow, "/slow").await;
        (r.body.len(), slow)
    });
    metric_at_least(&weir, filling, 60_000).await;

    let mut c = weir.client().await;
    let other = get(&mut c, "/other").await;
    assert_eq!((other.status, other.body.len()), (200, 60_000));
    let abandoned = "weir_cache_fills_abandoned_total{store=\"mem\"}";
    assert_eq!(weir.metric(abandoned), 1);
    let again = get(&mut c, "/other").await;
    assert_eq!(again.body.len(), 60_000);
    assert_eq!(
        again.header("Cache-Status"),
        Some("weir; fwd=uri-miss"),
        "the abandoned fill stored nothing"
    );

    go.notify_one();
    let (len, mut slow) = stalled.await.unwrap();
    assert_eq!(len, 100_000);
    // Stored once its copy is sealed (on the blocking pool): this waits for it.
    let hit = get(&mut slow, "/slow").await;
    let status = hit.header("Cache-Status").unwrap_or_default();
    assert!(status.starts_with("weir; hit"), "{status}");
    assert_eq!(hit.body.len(), 100_000);
    weir.wait_metric(filling, 0).await;
}

/// A small fill alone is well within the default bound: stored, nothing abandoned.
#[tokio::test]
async fn a_fill_within_the_default_bound_is_stored() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "hello");
    let weir = memory_store(b.addr());
    let mut c = weir.client().await;
    get(&mut c, "/").await;
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let hit = get(&mut c, "/").await;
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(
        weir.metric("weir_cache_fills_abandoned_total{store=\"mem\"}"),
        0
    );
    // A fill's memory is given back once its store job ends, just after it is counted.
    weir.wait_metric("weir_cache_fill_bytes{store=\"mem\"}", 0)
        .await;
}

/// A memory store counts what an entry's index really holds: its key twice (by key and in
/// use order) and the request URI its policy keeps, so long queries cannot make entries
/// take several times what `max_size` says.
#[tokio::test]
async fn a_memory_entry_counts_its_key_and_uri_each_time_they_are_held() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "x");
    let weir = memory_store(b.addr());
    let mut c = weir.client().await;
    let query = "q".repeat(8000);
    get(&mut c, &format!("/a?{query}")).await;
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let bytes = weir.metric("weir_cache_bytes{store=\"mem\"}");
    assert!(bytes >= 3 * 8000, "{bytes}");
}

/// A disk store's index stays within `index_size` whatever its `max_size`: entries with
/// long keys push the least recently used out of the index (and their files).
#[tokio::test]
async fn a_disk_store_s_index_stays_within_index_size() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=60")], "x");
    let dir = DiskDir::new("index");
    let store = format!(
        "[caches.disk]\nkind = \"disk\"\npath = \"{}\"\nmax_size = \"1GiB\"\nindex_size = \"64KiB\"",
        dir.0.display()
    );
    let weir = Conf::new()
        .route("c", "up", &["cache = { store = \"disk\" }"])
        .upstream("up", &[b.addr()], &[])
        .table(&store)
        .start();
    let mut c = weir.client().await;
    let query = "q".repeat(8000);
    for i in 0..6 {
        get(&mut c, &format!("/{i}?{query}")).await;
    }
    weir.wait_metric("weir_cache_stored_total{store=\"disk\"}", 6)
        .await;
    let index = weir.metric("weir_cache_index_bytes{store=\"disk\"}");
    assert!((24_000..=64 << 10).contains(&index), "{index}");
    let entries = weir.metric("weir_cache_entries{store=\"disk\"}");
    assert!((1..=2).contains(&entries), "{entries} entries");
    assert_eq!(
        weir.metric("weir_cache_evictions_total{store=\"disk\"}"),
        6 - entries
    );
    // The evicted entries' files went with them (the writes, on the blocking pool, may
    // land in any order: which entry stays is not asked).
    let files = std::fs::read_dir(&dir.0).unwrap().flatten();
    let files = files.flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten());
    assert_eq!(files.count() as u64, entries);
}

/// `max_fill_memory` under `max_object_size` (no object could ever be stored whole) and
/// `index_size` on a memory store are refused with their place; the defaults hold.
#[test]
fn fill_memory_and_index_size_are_checked_and_defaulted() {
    let listener = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n";
    let parse = |keys: &str| {
        weir_config::parse_str(&format!("{listener}\n[caches.d]\n{keys}\n"), "weir.toml")
    };
    let cases = [
        (
            "kind = \"memory\"\nmax_object_size = \"8MiB\"\nmax_fill_memory = \"1MiB\"",
            "caches.d.max_fill_memory",
            "smaller than max_object_size",
        ),
        (
            "kind = \"memory\"\nindex_size = \"1MiB\"",
            "caches.d.index_size",
            "memory cache store has no index_size",
        ),
    ];
    for (keys, field, says) in cases {
        let e = parse(keys).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(says), "{keys}: {e}");
    }
    let memory = parse("kind = \"memory\"\nmax_size = \"1GiB\"").unwrap();
    let store = &memory.caches[0];
    assert_eq!(
        (store.max_fill_memory, store.index_size),
        (256 << 20, u64::MAX)
    );
    let small = parse("kind = \"memory\"\nmax_size = \"16MiB\"").unwrap();
    assert_eq!(small.caches[0].max_fill_memory, 8 << 20, "max_object_size");
    let dir = DiskDir::new("defaults");
    let disk = format!(
        "kind = \"disk\"\npath = \"{}\"\nmax_size = \"10GiB\"",
        dir.0.display()
    );
    let disk = parse(&disk).unwrap();
    let store = &disk.caches[0];
    assert_eq!(
        (store.max_fill_memory, store.index_size),
        (256 << 20, 128 << 20)
    );
}

/// A response varying on a field Weir writes upstream in place of the client's copy (the
/// forwarded headers, a `request_headers` rule, the request id) is not stored: the client's
/// copy says nothing of what the upstream saw, so a response made for one client's
/// `X-Real-IP` was a hit for every other (attacker review). One varying on a field the
/// client's copy of goes upstream as it is still is.
#[tokio::test]
async fn a_response_varying_on_a_field_weir_writes_is_not_stored() {
    let rules =
        r#"request_headers = { set = { "X-Geo" = "{client_ip}" }, add = { "X-Via" = "weir" } }"#;
    let cases = [
        ("X-Real-IP", false),
        ("x-forwarded-for", false),
        ("Accept-Language, X_Forwarded_Proto", false),
        ("X-Geo", false),
        // A constant: every client's request says the same upstream.
        ("X-Via", true),
        ("X-Request-Id", false),
        ("Accept-Language", true),
    ];
    for (vary, stored) in cases {
        let fields = [("Cache-Control", "max-age=60"), ("Vary", vary)];
        let b = Backend::fixed(200, &fields, "for one client");
        let weir = Conf::new()
            .with_request_ids()
            .route("c", "up", &["cache = { store = \"mem\" }", rules])
            .upstream("up", &[b.addr()], &[])
            .table("[caches.mem]\nkind = \"memory\"")
            .start();
        let mut c = weir.client().await;
        get(&mut c, "/me").await;
        if stored {
            weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
                .await;
        }
        let mut other = weir.client().await;
        let again = get(&mut other, "/me").await;
        let want = match stored {
            true => "weir; hit",
            false => "weir; fwd=uri-miss",
        };
        assert_eq!(again.header("Cache-Status"), Some(want), "Vary: {vary}");
        assert_eq!(b.requests_served(), 2 - usize::from(stored), "Vary: {vary}");
    }
}

/// Was (review): a field the client lists in `Connection` is not forwarded, but `Vary` was
/// matched on it: `Accept-Language: fr` with `Connection: Accept-Language` stored the page
/// the upstream made without it as the `fr` variant, for every French client.
#[tokio::test]
async fn a_field_the_client_lists_in_connection_is_not_a_variant() {
    let fields = [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")];
    let b = Backend::fixed(200, &fields, "default page");
    let weir = Conf::new()
        .route("c", "up", &["cache = { store = \"mem\" }"])
        .upstream("up", &[b.addr()], &[])
        .table("[caches.mem]\nkind = \"memory\"")
        .start();
    let mut c = weir.client().await;
    let marked = [
        ("Host", "h"),
        ("Accept-Language", "fr"),
        ("Connection", "Accept-Language"),
    ];
    c.request("GET", "/page", &marked, b"").await.unwrap();
    weir.wait_metric("weir_cache_stored_total{store=\"mem\"}", 1)
        .await;
    let mut french = weir.client().await;
    let plain = [("Host", "h"), ("Accept-Language", "fr")];
    let r = french.request("GET", "/page", &plain, b"").await.unwrap();
    assert_eq!(r.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    assert_eq!(b.requests_served(), 2);
}

/// An upstream whose first answer is [`first_len`] bytes at once (chunked, or delimited
/// by the connection's close), then 5 more once `go` is notified; every other request gets a
/// 5-byte body. Counts the requests.
async fn stalling_first(chunked: bool, go: Arc<Notify>, asked: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (go, asked) = (go.clone(), asked.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while next_request(&mut s, &mut buf).await.is_some() {
                    let head = "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n";
                    if asked.fetch_add(1, SeqCst) > 0 {
                        let small = format!("{head}Content-Length: 5\r\n\r\nsmall");
                        if s.write_all(small.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let (framing, end): (&str, &[u8]) = match chunked {
                        true => (
                            "Transfer-Encoding: chunked\r\n\r\nea60\r\n",
                            b"\r\n5\r\nyyyyy\r\n0\r\n\r\n",
                        ),
                        false => ("Connection: close\r\n\r\n", b"yyyyy"),
                    };
                    let mut out = format!("{head}{framing}").into_bytes();
                    out.resize(out.len() + first_len(chunked), b'x');
                    if s.write_all(&out).await.is_err() {
                        return;
                    }
                    go.notified().await;
                    let _ = s.write_all(end).await;
                    if !chunked {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The bytes [`stalling_first`] sends at once: past a 20 KiB `max_object_size`, and past
/// what a chunked body may carry of framing too (twice the limit and 4 KiB).
fn first_len(chunked: bool) -> usize {
    match chunked {
        true => 60_000,
        false => 30_000,
    }
}

/// A fill abandoned mid-body (past `max_object_size`: a body whose length is not known up
/// front, chunked or delimited by the close) lets the requests waiting for its key go
/// upstream at once. Before, they waited for the response's end (a slow client's), up to
/// `lock_timeout` (here 60 s); and a body without chunk framing was only found too large
/// at twice the limit (30,000 bytes of a 20 KiB limit were still recorded).
#[tokio::test]
async fn an_abandoned_fill_lets_its_followers_go_at_once() {
    for chunked in [true, false] {
        let go = Arc::new(Notify::new());
        let asked = Arc::new(AtomicUsize::new(0));
        let addr = stalling_first(chunked, go.clone(), asked.clone()).await;
        let weir = Conf::new()
            .route(
                "c",
                "up",
                &["cache = { store = \"mem\", lock_timeout = \"60s\" }"],
            )
            .upstream("up", &[addr], &[])
            .table("[caches.mem]\nkind = \"memory\"\nmax_object_size = \"20KiB\"")
            .start();
        let mut leader = weir.client().await;
        let stalled = tokio::spawn(async move { get(&mut leader, "/big").await.body.len() });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while asked.load(SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the leader never asked"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut follower = weir.client().await;
        let answered = tokio::time::timeout(Duration::from_secs(8), get(&mut follower, "/big"));
        let r = answered
            .await
            .expect("the follower waited for the abandoned fill");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"small"[..]));
        assert_eq!(
            asked.load(SeqCst),
            2,
            "chunked {chunked}: the follower went itself"
        );
        go.notify_one();
        let whole = first_len(chunked) + 5;
        assert_eq!(
            stalled.await.unwrap(),
            whole,
            "the leader's response streams on"
        );
    }
}
