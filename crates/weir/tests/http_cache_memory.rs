//! What a disk store's answers hold in memory while their clients read slowly, counted by
//! this binary's allocator ([`Counting`]): Weir runs in this process, so what its
//! requests hold shows in the live bytes (not RSS, which keeps what the allocator freed).
//! Each test opens many HTTP/2 streams that get no window: each holds its answer and
//! sends nothing of its body. A body read into memory per request (review of content2:
//! a stale entry revalidated, a large hit under `sendfile_min_size`) shows as one copy
//! per stream; one sent from the entry's file, as none. One test at a time ([`SERIAL`]):
//! another's allocations would count.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::LazyLock;

use bytes::Bytes;
use common::{Conf, DiskDir, Weir};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use weir_testkit::Backend;

/// The bytes this process's allocations hold now.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting in [`LIVE`].
struct Counting;

#[global_allocator]
static COUNTING: Counting = Counting;

// SAFETY: every call is the system allocator's with the caller's own arguments; the
// count beside it touches no memory it hands out.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let at = unsafe { System.alloc(layout) };
        if !at.is_null() {
            LIVE.fetch_add(layout.size(), Relaxed);
        }
        at
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let at = unsafe { System.alloc_zeroed(layout) };
        if !at.is_null() {
            LIVE.fetch_add(layout.size(), Relaxed);
        }
        at
    }

    unsafe fn dealloc(&self, at: *mut u8, layout: Layout) {
        unsafe { System.dealloc(at, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, at: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(at, layout, new_size) };
        if !moved.is_null() {
            // Added first: the count never dips below what is live.
            LIVE.fetch_add(new_size, Relaxed);
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        moved
    }
}

/// Held by each test while it runs.
static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

/// The stored body: more than a stream's own bookkeeping by far.
const BODY: usize = 4 << 20;

/// Streams at once: a copy each would hold `STREAMS x BODY` (64 MiB).
const STREAMS: usize = 16;

/// The route's `lock_timeout`: a request answered stale holds its key's fetch until its
/// answer is sent (never, with no window), and the next would wait for it.
const NO_WAIT: &str = ", lock_timeout = \"0s\"";

/// The body: letters that change with each byte, so that a misplaced piece shows.
fn body() -> Vec<u8> {
    (0..BODY).map(|i| b'a' + (i % 23) as u8).collect()
}

/// Route `c` on `/` caching in the disk store `disk` at `dir` (`store_keys`: more of its
/// keys; `route_keys`: more of the route's `cache`), to `upstream`.
fn disk_cached(upstream: SocketAddr, dir: &DiskDir, store_keys: &str, route_keys: &str) -> Weir {
    let store = format!(
        "[caches.disk]\nkind = \"disk\"\npath = \"{}\"\nmax_size = \"64MiB\"\n{store_keys}",
        dir.0.display()
    );
    let cache = format!("cache = {{ store = \"disk\"{route_keys} }}");
    Conf::new()
        // The first streams wait for their window as long as the others take to open (a
        // loaded machine): not reset meanwhile.
        .listener("http2 = { stall_timeout = \"300s\" }")
        .route("c", "up", &[&cache])
        .upstream("up", &[upstream], &[])
        .table(&store)
        .start()
}

/// An upstream answering `GET`s with [`body`], `ETag: "v1"` and stale at once
/// (`max-age=0`), and each request with `If-None-Match` with a `304` (stale at once
/// again: every request revalidates).
async fn etag_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fields = "ETag: \"v1\"\r\nCache-Control: max-age=0\r\n";
    let mut full =
        format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: {BODY}\r\n\r\n").into_bytes();
    full.extend_from_slice(&body());
    let full = Bytes::from(full);
    let confirmed = Bytes::from(format!("HTTP/1.1 304 Not Modified\r\n{fields}\r\n"));
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (full, confirmed) = (full.clone(), confirmed.clone());
            tokio::spawn(async move {
                let mut socket = BufReader::new(socket);
                let mut conditional = false;
                let mut line = String::new();
                while socket.read_line(&mut line).await.is_ok_and(|n| n > 0) {
                    conditional |= line.starts_with("If-None-Match:");
                    if line == "\r\n" {
                        let answer = if conditional { &confirmed } else { &full };
                        if socket.get_mut().write_all(answer).await.is_err() {
                            return;
                        }
                        conditional = false;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

/// An upstream answering every request with [`body`] and `Cache-Control: cache_control`.
fn fixed_body(cache_control: &str) -> Backend {
    let text = String::from_utf8(body()).expect("the pattern is ASCII");
    Backend::fixed(200, &[("Cache-Control", cache_control)], &text)
}

/// Fetches `/big` once (the store keeps it) and waits until it is stored.
async fn store_it(weir: &Weir) {
    let mut c = weir.client().await;
    let first = c.get("/big", "example.com").await.expect("response");
    assert!(first.body == body(), "the upstream's body, whole");
    drop(first);
    weir.wait_metric("weir_cache_stored_total{store=\"disk\"}", 1)
        .await;
}

/// Opens [`STREAMS`] streams for `/big`, one after the other, on an HTTP/2 connection
/// that gives them no window, each answered with `cache_status` (`after`: what to wait
/// for once it is, before the next). The bytes the streams hold together once all were
/// answered must be less than one body: then their window opens, and each body must be
/// the whole [`body`].
async fn held_by_streams(weir: &Weir, cache_status: &str, after: impl AsyncFn(usize)) {
    let (mut h2, open) = common::h2c_without_window(weir.addr, 8 << 20, 64 << 20).await;
    let before = LIVE.load(Relaxed);
    let mut answered = Vec::new();
    for i in 0..STREAMS {
        h2 = h2.ready().await.expect("h2 ready");
        let request = http::Request::get("http://example.com/big")
            .body(())
            .unwrap();
        let (response, _) = h2.send_request(request, true).expect("send");
        let response = response.await.expect("head");
        let got = response.headers().get("cache-status");
        assert_eq!(got.and_then(|v| v.to_str().ok()), Some(cache_status));
        answered.push(response);
        after(i).await;
    }
    let held = LIVE.load(Relaxed).saturating_sub(before);
    eprintln!("{STREAMS} streams answered {cache_status:?} hold {held} bytes");
    assert!(held < BODY, "{STREAMS} streams hold {held} bytes");
    open.send(()).expect("the connection task runs");
    for response in answered {
        let mut body_stream = response.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body_stream.data().await {
            let chunk = chunk.expect("data");
            let _ = body_stream.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        assert!(
            got == body(),
            "the stored body, whole ({} bytes)",
            got.len()
        );
    }
}

/// Review of content2: each request revalidating a stale disk entry read its whole body
/// into memory (before even waiting for the fetch of its key), and a `304` answered from
/// that copy: 16 slow clients of a 4 MiB entry held 64 MiB. Now the entry's file answers,
/// as a fresh hit's does, and the refreshed entry's file gets the body copied file to
/// file: the streams hold less than one body together.
#[tokio::test]
async fn stale_disk_answers_a_304_confirmed_hold_no_copy_of_the_body() {
    let _one = SERIAL.lock().await;
    let dir = DiskDir::new("revalidated");
    // Each request goes upstream at once, without waiting for the one before.
    let weir = disk_cached(etag_upstream().await, &dir, "", NO_WAIT);
    store_it(&weir).await;
    let confirmed = "weir; fwd=stale; fwd-status=304";
    // Each 304 stores the entry again: the next stream finds its file in place.
    let refreshed = async |i: usize| {
        let stored = "weir_cache_stored_total{store=\"disk\"}";
        weir.wait_metric(stored, 2 + i as u64).await;
    };
    held_by_streams(&weir, confirmed, refreshed).await;
    assert_eq!(
        weir.metric("weir_cache_revalidations_total{store=\"disk\"}"),
        STREAMS as u64
    );
    assert_eq!(weir.metric("weir_cache_errors_total{store=\"disk\"}"), 0);
}

/// The same for a stale entry answering for an upstream that is gone (`serve_stale_on`):
/// each such request read the whole body first too.
#[tokio::test]
async fn stale_disk_answers_for_a_failure_hold_no_copy_of_the_body() {
    let _one = SERIAL.lock().await;
    let dir = DiskDir::new("failure");
    let up = fixed_body("max-age=0");
    let route = format!("{NO_WAIT}, serve_stale_on = [\"error\"]");
    let weir = disk_cached(up.addr(), &dir, "", &route);
    store_it(&weir).await;
    drop(up);
    held_by_streams(&weir, "weir; hit; detail=stale", async |_| {}).await;
}

/// Review of content2: a hit whose body is under the store's `sendfile_min_size` was read
/// whole into memory by each request, however large its file (a `sendfile_min_size` over
/// `max_object_size` made every hit a copy). Now any file over 64 KiB answers as itself.
#[tokio::test]
async fn hits_under_sendfile_min_size_hold_no_copy_of_the_body() {
    let _one = SERIAL.lock().await;
    let dir = DiskDir::new("under-sendfile");
    let up = fixed_body("max-age=600");
    let weir = disk_cached(up.addr(), &dir, "sendfile_min_size = \"1GiB\"", "");
    store_it(&weir).await;
    held_by_streams(&weir, "weir; hit", async |_| {}).await;
    assert_eq!(up.requests_served(), 1, "hits, not fetches");
}
