//! The HTTP/2 attacks of 2016-2025, each mounted over a real socket with hand-made frames
//! (`weir_testkit::h2_raw`), against an h2c listener: MadeYouReset, CONTINUATION floods,
//! HPACK bombs, SETTINGS / PING / empty-DATA / WINDOW_UPDATE / PRIORITY floods, clients
//! that never read or give no window. Each test asserts the outcome: the GOAWAY and its
//! code or the close, what the upstream saw, and that other connections are still served.
//! (Rapid reset and reset cancellation: `h2c_proxy.rs`. Memory under attack:
//! `process_h2_memory.rs`.)

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use tokio::net::TcpStream;

use common::{single, WAIT};
use weir_testkit::h2_raw::{flag, frame, kind, Block, Ending, RawH2};
use weir_testkit::{pattern_hash, wait_until_async, Backend, Hasher};

const ENHANCE_YOUR_CALM: u32 = 0xb;
const CANCEL: u32 = 0x8;
/// For waits that include a `stall_timeout` and filling socket buffers on a busy machine.
const LONG_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// SETTINGS_INITIAL_WINDOW_SIZE.
const INITIAL_WINDOW: u16 = 0x4;

fn web(name: &str) -> String {
    format!("weir_http2_{name}_total{{listener=\"web\"}}")
}

/// A well-behaved h2 client (the `h2` crate's) gets `path` answered with 200: the
/// listener still serves other connections.
async fn still_served(addr: std::net::SocketAddr, path: &str) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://example.test{path}"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(req, true).expect("send");
    let response = tokio::time::timeout(WAIT, response)
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

/// Resets Weir must send because of the client's errors on its streams (a WINDOW_UPDATE
/// that overflows the stream's window, DATA beyond content-length, a connection-specific
/// field) count in the reset budget:
/// past it, GOAWAY ENHANCE_YOUR_CALM, although the `h2` crate's own (lifetime) limit of
/// such resets is far away.
#[tokio::test]
async fn made_you_reset_past_the_budget_gets_goaway_enhance_your_calm() {
    let backend = Backend::hang();
    let weir = single(backend.addr())
        .listener("http2 = { reset_budget = 5, reset_window = \"60s\" }")
        .start();
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let mut out = Vec::new();
    for i in 0..10u32 {
        let id = 2 * i + 1;
        match i % 3 {
            0 => {
                let block = Block::post("/a");
                frame(&mut out, kind::HEADERS, flag::END_HEADERS, id, &block.0);
                // 65535 + 2^31-1 overflows the window: FLOW_CONTROL_ERROR on the stream.
                let overflow = 0x7fff_ffffu32.to_be_bytes();
                frame(&mut out, kind::WINDOW_UPDATE, 0, id, &overflow);
            }
            1 => {
                let block = Block::post("/b").literal("content-length", b"2");
                frame(&mut out, kind::HEADERS, flag::END_HEADERS, id, &block.0);
                frame(&mut out, kind::DATA, flag::END_STREAM, id, b"too long");
            }
            _ => {
                let block = Block::get("/c").literal("connection", b"close");
                let flags = flag::END_HEADERS | flag::END_STREAM;
                frame(&mut out, kind::HEADERS, flags, id, &block.0);
            }
        }
    }
    raw.send(&out).await.expect("send");
    let mut resets = 0;
    let goaway = raw
        .until(WAIT, |f| {
            let forced = !matches!(f.error_code(), Some(0 | CANCEL));
            if f.kind == kind::RST_STREAM && forced {
                resets += 1;
            }
            (f.kind == kind::GOAWAY).then(|| f.error_code())
        })
        .await;
    assert_eq!(goaway, Some(Some(ENHANCE_YOUR_CALM)));
    assert!(resets >= 6, "{resets} resets before the GOAWAY");
    // Counted once written: poll, the client may have read them first.
    let forced = || weir.metric(&web("forced_resets")) >= 6;
    assert!(wait_until_async(WAIT, forced).await);
    assert_eq!(weir.metric(&web("calm_goaways")), 1);
    // Requests that reached the upstream were cancelled with their streams.
    assert!(wait_until_async(WAIT, || backend.in_flight() == 0).await);
    assert!(backend.requests_served() <= 10);
}

/// CONTINUATION frames without END_HEADERS, on and on (CVE-2024-27316): the `h2` crate
/// counts them against SETTINGS_MAX_HEADER_LIST_SIZE / max frame size and sends GOAWAY;
/// nothing reaches the upstream, other connections are served.
#[tokio::test]
async fn continuation_flood_gets_goaway_and_nothing_reaches_the_upstream() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr()).start();
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let mut out = Vec::new();
    frame(&mut out, kind::HEADERS, 0, 1, &Block::get("/").0);
    // The `h2` crate allows max_header_list_size / max_frame_size + 25% (at least 5)
    // CONTINUATION frames: 8 is past it. Few bytes, so Weir reads them all before it
    // closes (unread bytes would turn its close into a TCP reset that eats the GOAWAY).
    let filler = Block::default().literal("x-filler", &[b'a'; 100]);
    for _ in 0..8 {
        frame(&mut out, kind::CONTINUATION, 0, 1, &filler.0);
    }
    raw.send(&out).await.expect("send");
    assert_eq!(
        raw.until_goaway(WAIT).await,
        Ending::GoAway(ENHANCE_YOUR_CALM)
    );
    assert!(raw.until_closed(WAIT).await);
    still_served(weir.addr, "/").await;
    assert_eq!(
        backend.requests_served(),
        1,
        "only the well-behaved request"
    );
}

/// The endless kind: a writer that never stops finds the connection closed after a
/// bounded number of bytes (Weir stopped reading and closed it).
#[tokio::test]
async fn endless_continuation_frames_end_with_a_closed_connection() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr()).start();
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    raw.send_frame(kind::HEADERS, 0, 1, &Block::get("/").0)
        .await
        .expect("headers");
    let mut chunk = Vec::new();
    for _ in 0..16 {
        frame(&mut chunk, kind::CONTINUATION, 0, 1, &[]);
    }
    let mut sent = 0usize;
    let flood = async {
        while raw.send(&chunk).await.is_ok() {
            sent += chunk.len();
            if sent > 64 << 20 {
                break;
            }
        }
    };
    tokio::time::timeout(WAIT, flood)
        .await
        .expect("closed in time");
    assert!(
        sent < 64 << 20,
        "Weir kept reading {sent} bytes of CONTINUATION"
    );
    assert_eq!(backend.requests_served(), 0);
    assert_eq!(weir.metric(&web("calm_goaways")), 1);
    still_served(weir.addr, "/").await;
}

/// An HPACK bomb: one large field in the dynamic table, then a block of one-byte
/// references to it. Up to 4x SETTINGS_MAX_HEADER_LIST_SIZE decoded, the `h2` crate
/// stops keeping fields and answers 431 on the stream (the connection goes on); beyond,
/// GOAWAY ENHANCE_YOUR_CALM. Nothing reaches the upstream.
#[tokio::test]
async fn hpack_bomb_is_refused_without_reaching_the_upstream() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr()).start();
    // 20 references to a 4 KB field: 80 KB decoded from 4 KB on the wire, over 64 KiB.
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let mut block = Block::get("/").literal_add("x-bomb", &[b'b'; 4000]);
    for _ in 0..20 {
        block = block.indexed(62);
    }
    let flags = flag::END_HEADERS | flag::END_STREAM;
    raw.send_frame(kind::HEADERS, flags, 1, &block.0)
        .await
        .expect("send");
    let refused = raw
        .until(WAIT, |f| {
            let ends = f.kind == kind::HEADERS && f.flags & flag::END_STREAM != 0;
            (f.stream == 1 && (ends || f.kind == kind::RST_STREAM)).then_some(f.kind)
        })
        .await;
    assert_eq!(refused, Some(kind::HEADERS), "431 on the stream");
    // The connection goes on: a plain request on it gets 200 (indexed :status 200).
    let flags = flag::END_HEADERS | flag::END_STREAM;
    raw.send_frame(kind::HEADERS, flags, 3, &Block::get("/ok").0)
        .await
        .expect("send");
    let status = raw
        .until(WAIT, |f| {
            (f.stream == 3 && f.kind == kind::HEADERS).then(|| f.payload.first().copied())
        })
        .await;
    assert_eq!(status, Some(Some(0x88)), ":status 200");
    assert_eq!(backend.requests_served(), 1, "only /ok");

    // 100 references: 400 KB decoded, past 4x the limit.
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let mut block = Block::get("/").literal_add("x-bomb", &[b'b'; 4000]);
    for _ in 0..100 {
        block = block.indexed(62);
    }
    raw.send_frame(kind::HEADERS, flags, 1, &block.0)
        .await
        .expect("send");
    assert_eq!(
        raw.until_goaway(WAIT).await,
        Ending::GoAway(ENHANCE_YOUR_CALM)
    );
    assert_eq!(backend.requests_served(), 1);
}

/// Many small fields in a small block (one dynamic entry referenced 300 times, 10 KB
/// decoded: within max_header_list_size) meet the listener's `max_headers`: 431.
#[tokio::test]
async fn many_fields_are_capped_by_max_headers() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr()).listener("max_headers = 50").start();
    let tcp = TcpStream::connect(weir.addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder().uri("http://example.test/");
    for _ in 0..300 {
        req = req.header("a", "b");
    }
    let (response, _) = client
        .send_request(req.body(()).expect("request"), true)
        .expect("send");
    let response = response.await.expect("response");
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(backend.requests_served(), 0);
    // The same connection goes on.
    let req = Request::get("http://example.test/").body(()).expect("req");
    let (response, _) = client.send_request(req, true).expect("send");
    assert_eq!(response.await.expect("response").status(), StatusCode::OK);
}

/// A request head within `max_header_list_size` (64 KiB) but over the listener's
/// `max_header_size` as the HTTP/1.1 head written for it gets 431, as an HTTP/1.1 client's
/// head does: no upstream gets a larger head, whatever protocol the client spoke.
#[tokio::test]
async fn a_head_over_max_header_size_is_431_as_over_http1() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr())
        .listener("max_header_size = \"2KiB\"")
        .start();
    let tcp = TcpStream::connect(weir.addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    for (len, status) in [
        (3000, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        (1000, StatusCode::OK),
    ] {
        let req = Request::get("http://example.test/")
            .header("x-big", "v".repeat(len))
            .body(())
            .expect("request");
        let (response, _) = client.send_request(req, true).expect("send");
        assert_eq!(response.await.expect("response").status(), status, "{len}");
    }
    assert_eq!(backend.requests_served(), 1);
    let over = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nx-big: {}\r\n\r\n",
        "v".repeat(3000)
    );
    let raw = weir_testkit::send_raw_once(weir.addr, over.as_bytes())
        .await
        .expect("answer");
    assert_eq!(weir_testkit::status_of(&raw), Some(431));
}

/// A raw connection with `settings` that has sent `GET /huge` on stream 1.
async fn get_huge(addr: std::net::SocketAddr, settings: &[(u16, u32)]) -> RawH2 {
    let mut raw = RawH2::connect(addr, settings).await.expect("connect");
    let flags = flag::END_HEADERS | flag::END_STREAM;
    raw.send_frame(kind::HEADERS, flags, 1, &Block::get("/huge").0)
        .await
        .expect("request");
    raw
}

/// One flood of `n` glitch frames of a kind, as bytes. `id` 1 is a POST left open.
fn flood(what: &str, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        match what {
            "ping" => frame(&mut out, kind::PING, 0, 0, &(i as u64).to_be_bytes()),
            "settings" => frame(&mut out, kind::SETTINGS, 0, 0, &[]),
            "empty-data" => frame(&mut out, kind::DATA, 0, 1, &[]),
            "window-update" => frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes()),
            "priority" => frame(&mut out, kind::PRIORITY, 0, 5, &[0, 0, 0, 0, 16]),
            _ => frame(&mut out, 0xfa, 0, 0, b"unknown"),
        }
    }
    out
}

/// SETTINGS, PING, empty DATA, WINDOW_UPDATE (with no DATA to explain them), PRIORITY
/// and unknown-frame floods
/// (CVE-2019-9512, -9515, -9518 and kin): each frame is a glitch; past `glitch_budget`,
/// GOAWAY ENHANCE_YOUR_CALM. A few of each stay within the budget.
#[tokio::test]
async fn control_frame_floods_past_the_glitch_budget_get_goaway() {
    let backend = Backend::hang();
    let weir = single(backend.addr())
        .listener("http2 = { glitch_budget = 50, glitch_window = \"60s\" }")
        .start();
    let kinds = [
        "ping",
        "settings",
        "empty-data",
        "window-update",
        "priority",
        "unknown",
    ];
    for (i, what) in kinds.into_iter().enumerate() {
        let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
        raw.send_frame(kind::HEADERS, flag::END_HEADERS, 1, &Block::post("/").0)
            .await
            .expect("headers");
        // Within the budget: the connection answers a PING after them.
        raw.send(&flood(what, 20)).await.expect("send");
        raw.send_frame(kind::PING, 0, 0, b"still-ok")
            .await
            .expect("ping");
        let pong = raw
            .until(WAIT, |f| {
                let ack = f.kind == kind::PING && f.flags & flag::ACK != 0;
                (ack && f.payload == b"still-ok").then_some(())
            })
            .await;
        assert_eq!(pong, Some(()), "{what}: answered within the budget");
        raw.send(&flood(what, 40)).await.expect("send");
        assert_eq!(
            raw.until_goaway(WAIT).await,
            Ending::GoAway(ENHANCE_YOUR_CALM),
            "{what}"
        );
        assert_eq!(weir.metric(&web("calm_goaways")), i as u64 + 1, "{what}");
    }
    assert!(weir.metric(&web("glitches")) >= 6 * 51);
    // The hanging upstream requests of the flooding connections were cancelled.
    assert!(wait_until_async(WAIT, || backend.in_flight() == 0).await);
}

/// A client that asks for a large response and never reads its socket (CVE-2019-9517):
/// Weir's writes stop making progress, and after `stall_timeout` the connection is
/// dropped (no GOAWAY can reach such a client) and its upstream request cancelled.
#[tokio::test]
async fn a_client_that_never_reads_is_closed_after_stall_timeout() {
    let backend = Backend::huge(1 << 30);
    let weir = single(backend.addr())
        .listener("http2 = { stall_timeout = \"1s\" }")
        .start();
    let mut raw = RawH2::connect_not_reading(weir.addr, &[(INITIAL_WINDOW, (1 << 31) - 1)])
        .await
        .expect("connect");
    let window = ((1u32 << 31) - 1 - 65_535).to_be_bytes();
    raw.send_frame(kind::WINDOW_UPDATE, 0, 0, &window)
        .await
        .expect("window");
    let flags = flag::END_HEADERS | flag::END_STREAM;
    raw.send_frame(kind::HEADERS, flags, 1, &Block::get("/huge").0)
        .await
        .expect("request");
    // Never read: Weir fills the socket buffers, then waits.
    assert!(
        wait_until_async(LONG_WAIT, || weir.metric(&web("stalled")) == 1).await,
        "stalled connections closed: {}",
        weir.metric(&web("stalled"))
    );
    assert!(wait_until_async(WAIT, || backend.in_flight() == 0).await);
    still_served(weir.addr, "/").await;
}

/// A PING flood from a client that never reads (CVE-2019-9512 with the glitch budget out
/// of the way): the `h2` crate queues one PING ACK at a time and stops reading while it
/// cannot write it, so the outbound queue stays bounded; Weir's writes stall and the
/// connection is closed after `stall_timeout`.
#[tokio::test]
async fn a_ping_flood_that_never_reads_is_bounded_and_closed() {
    let backend = Backend::echo("up");
    let weir = single(backend.addr())
        .listener("http2 = { glitch_budget = 1000000, stall_timeout = \"1s\" }")
        .start();
    let raw = RawH2::connect_not_reading(weir.addr, &[])
        .await
        .expect("connect");
    let pings = flood("ping", 4096);
    let mut tcp = raw.tcp;
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut sent = 0usize;
        // Until Weir closes the connection (or 256 MiB, which would mean it never did).
        while sent < 256 << 20 && tcp.write_all(&pings).await.is_ok() {
            sent += pings.len();
        }
        sent
    });
    // Generous: Weir answers PINGs one by one until the socket buffers are full.
    assert!(
        wait_until_async(LONG_WAIT, || weir.metric(&web("stalled")) == 1).await,
        "stalled: {}",
        weir.metric(&web("stalled"))
    );
    let sent = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer saw the close")
        .expect("writer");
    assert!(
        sent < 256 << 20,
        "Weir read {sent} bytes of PINGs it could not answer"
    );
    still_served(weir.addr, "/").await;
}

/// A stream with no window (SETTINGS_INITIAL_WINDOW_SIZE 0, never raised) is reset
/// (CANCEL) after `stall_timeout` and its upstream request cancelled; the connection,
/// which reads, goes on.
#[tokio::test]
async fn a_stream_without_window_is_reset_after_stall_timeout() {
    let backend = Backend::huge(1 << 20);
    let weir = single(backend.addr())
        .listener("http2 = { stall_timeout = \"1s\" }")
        .start();
    let mut raw = get_huge(weir.addr, &[(INITIAL_WINDOW, 0)]).await;
    let reset = raw
        .until(WAIT, |f| {
            (f.stream == 1 && f.kind == kind::RST_STREAM).then(|| f.error_code())
        })
        .await;
    assert_eq!(reset, Some(Some(CANCEL)));
    assert!(wait_until_async(WAIT, || backend.in_flight() == 0).await);
    raw.send_frame(kind::PING, 0, 0, b"after-it")
        .await
        .expect("ping");
    let pong = raw
        .until(WAIT, |f| {
            (f.kind == kind::PING && f.payload == b"after-it").then_some(())
        })
        .await;
    assert_eq!(pong, Some(()));
    assert_eq!(weir.metric(&web("stalled")), 0);
}

/// Well-behaved traffic has no glitches: a large download by the `h2` crate's client
/// (which sends WINDOW_UPDATEs as it reads) counts none.
#[tokio::test]
async fn a_large_download_is_no_glitch() {
    let backend = Backend::huge(8 << 20);
    let weir = single(backend.addr()).start();
    let tcp = TcpStream::connect(weir.addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let req = Request::get("http://example.test/").body(()).expect("req");
    let (response, _) = client.send_request(req, true).expect("send");
    let mut body = response.await.expect("response").into_body();
    let mut n = 0;
    while let Some(chunk) = body.data().await {
        let chunk: Bytes = chunk.expect("chunk");
        n += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert_eq!(n, 8 << 20);
    assert_eq!(weir.metric(&web("glitches")), 0);
}

/// A gRPC-style client pings once per round trip while a long download arrives (BDP
/// pings: each PING after the ACK of the previous one and a DATA frame since): no glitch,
/// no GOAWAY, far past the glitch budget in PINGs. (A PING flood is still one:
/// `control_frame_floods_past_the_glitch_budget_get_goaway`.)
#[tokio::test]
async fn bdp_pings_during_a_download_are_no_glitches() {
    let size = 4usize << 20;
    let backend = Backend::huge(size as u64);
    let weir = single(backend.addr())
        .listener("http2 = { glitch_budget = 10, glitch_window = \"60s\" }")
        .start();
    let mut raw = get_huge(weir.addr, &[]).await;
    let (mut received, mut pings, mut waiting_ack, mut data_since_ack) = (0, 0u64, false, false);
    // Window is released in batches of half the default window, as real clients do.
    let mut unacked = 0u32;
    let download = async {
        while let Some(f) = raw.read_frame().await {
            assert_ne!(f.kind, kind::GOAWAY, "GOAWAY after {pings} pings");
            if f.kind == kind::PING && f.flags & flag::ACK != 0 {
                waiting_ack = false;
                data_since_ack = false;
            }
            if f.kind == kind::DATA && f.stream == 1 {
                received += f.payload.len();
                data_since_ack = true;
                unacked += f.payload.len() as u32;
                if unacked >= 32 << 10 {
                    let n = std::mem::take(&mut unacked).to_be_bytes();
                    raw.send_frame(kind::WINDOW_UPDATE, 0, 0, &n)
                        .await
                        .expect("wu");
                    raw.send_frame(kind::WINDOW_UPDATE, 0, 1, &n)
                        .await
                        .expect("wu");
                }
                if f.flags & flag::END_STREAM != 0 {
                    return;
                }
            }
            if !waiting_ack && data_since_ack {
                pings += 1;
                raw.send_frame(kind::PING, 0, 0, &pings.to_be_bytes())
                    .await
                    .expect("ping");
                waiting_ack = true;
            }
        }
    };
    tokio::time::timeout(LONG_WAIT, download)
        .await
        .expect("downloaded in time");
    assert_eq!(received, size);
    assert!(pings > 20, "only {pings} pings");
    assert_eq!(weir.metric(&web("glitches")), 0);
    assert_eq!(weir.metric(&web("calm_goaways")), 0);
}

/// The data dribble (CVE-2019-9511): a client that grants 1-byte windows gets 1-byte DATA
/// frames; each such tiny WINDOW_UPDATE is a glitch, and past the budget the client gets
/// GOAWAY ENHANCE_YOUR_CALM instead of a dribble forever.
#[tokio::test]
async fn a_one_byte_window_dribble_gets_goaway() {
    let backend = Backend::huge(1 << 20);
    let weir = single(backend.addr())
        .listener("http2 = { glitch_budget = 50, glitch_window = \"60s\" }")
        .start();
    let mut raw = get_huge(weir.addr, &[(INITIAL_WINDOW, 1)]).await;
    // Grant one byte for every byte received, as a dribbling client does.
    let mut tiny_frames = 0;
    let mut goaway = None;
    let dribble = async {
        while let Some(f) = raw.read_frame().await {
            if f.kind == kind::GOAWAY {
                goaway = f.error_code();
                return;
            }
            if f.kind == kind::DATA && f.stream == 1 && !f.payload.is_empty() {
                tiny_frames += 1;
                let one = 1u32.to_be_bytes();
                if raw
                    .send_frame(kind::WINDOW_UPDATE, 0, 1, &one)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(LONG_WAIT, dribble)
        .await
        .expect("ended in time");
    assert_eq!(
        goaway,
        Some(ENHANCE_YOUR_CALM),
        "after {tiny_frames} frames"
    );
    assert!(tiny_frames <= 60, "{tiny_frames} one-byte frames");
    assert_eq!(weir.metric(&web("calm_goaways")), 1);
}

/// A client's GOAWAY (RFC 9113 section 6.8) is not an attack but the other side of
/// "GOAWAY both sides": the stream it already opened is still answered in full, and
/// Weir then closes the connection instead of keeping it for requests that cannot come.
#[tokio::test]
async fn a_client_goaway_lets_its_open_stream_finish_then_the_connection_closes() {
    let backend = Backend::slow(std::time::Duration::from_millis(100));
    let weir = single(backend.addr()).start();
    let mut raw = RawH2::connect(weir.addr, &[]).await.expect("connect");
    let flags = flag::END_HEADERS | flag::END_STREAM;
    let mut out = Vec::new();
    frame(&mut out, kind::HEADERS, flags, 1, &Block::get("/slow").0);
    // Last stream 0: the client processed no stream of Weir's (it never opens one).
    frame(&mut out, kind::GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]);
    raw.send(&out).await.expect("request and GOAWAY");
    let mut status_200 = false;
    let ended = raw
        .until(WAIT, |f| {
            if f.stream == 1 && f.kind == kind::HEADERS {
                // HPACK static index 8 is ":status: 200".
                status_200 = f.payload.first() == Some(&0x88);
            }
            (f.stream == 1 && f.flags & flag::END_STREAM != 0).then_some(())
        })
        .await;
    assert_eq!(ended, Some(()), "the open stream was answered to its end");
    assert!(status_200, "with the upstream's 200");
    assert_eq!(backend.requests_served(), 1);
    assert!(raw.until_closed(WAIT).await, "then the connection closed");
}

/// A backend that answers each request with a `len`-byte body (`/bytes/<n>`: `n` bytes)
/// and counts the body bytes its sockets took (`sent`): with a small send buffer (no
/// autotuning), little of what it counts waits in its own kernel.
async fn counting_backend(len: u64) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_send_buffer_size(16 * 1024).expect("sndbuf");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(64).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve_counted(conn, len, counter.clone()));
        }
    });
    (addr, sent)
}

/// Reads a request head from `conn`, then writes a `len`-byte body, adding to `sent`
/// what the socket takes, until done or the peer leaves.
async fn serve_counted(mut conn: TcpStream, len: u64, sent: Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let asked = String::from_utf8_lossy(&head);
    let len = (asked.strip_prefix("GET /bytes/"))
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or(len);
    let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
    if conn.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let chunk = vec![b'x'; 16 * 1024];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        if conn.write_all(&chunk[..n]).await.is_err() {
            return;
        }
        off += n as u64;
        sent.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Many streams of large responses on a connection that opened its windows wide and never
/// reads: all its streams together leave at most `max_connection_send_buffer` with the
/// `h2` crate, not `max_send_buffer` each. Measured at the upstreams: what they managed
/// to send is that bound plus socket buffers, far below streams x `max_send_buffer`.
#[tokio::test]
async fn many_streams_that_never_read_hold_at_most_the_connection_send_buffer() {
    let (_weir, _raw, sent) = many_huge_streams_not_read().await;
    // Until the upstreams are all blocked: nothing more sent for a second.
    let settled = settles(&sent).await;
    let sent = sent.load(Ordering::Relaxed);
    assert!(settled, "the upstreams never stopped: {sent} bytes");
    eprintln!("upstreams sent {} KiB", sent >> 10);
    // Measured on loopback: 6.6 MiB (1 MiB in Weir, the rest in socket buffers, about
    // 350 KiB a stream); 71 MiB before the bound.
    let unbounded = u64::from(STREAMS) * PER_STREAM;
    assert!(
        sent < unbounded / 4,
        "Weir took {} KiB from the upstreams (streams x max_send_buffer: {} KiB)",
        sent >> 10,
        unbounded >> 10
    );
}

/// Downloads `path` on the connection `client`, reading as it comes; returns the body's
/// length and hash, or why it failed.
async fn download(
    mut client: h2::client::SendRequest<Bytes>,
    path: &str,
) -> Result<(u64, u64), h2::Error> {
    client = client.ready().await?;
    let req = Request::get(format!("http://example.test{path}"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(req, true)?;
    let mut body = response.await?.into_body();
    let mut hasher = Hasher::new();
    let mut n = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        n += chunk.len() as u64;
        hasher.update(&chunk);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok((n, hasher.finish()))
}

/// Several large downloads at once through a connection bound far below them
/// (`max_connection_send_buffer` at its least): the streams wait for room and are woken
/// as the connection writes, and every body arrives whole.
#[tokio::test]
async fn concurrent_downloads_complete_through_a_small_connection_send_buffer() {
    const STREAMS: usize = 8;
    const SIZE: u64 = 2 << 20;
    let backend = Backend::huge(SIZE);
    let weir = single(backend.addr())
        .listener("http2 = { max_connection_send_buffer = \"16KiB\", stall_timeout = \"5s\" }")
        .start();
    let tcp = TcpStream::connect(weir.addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let downloads: Vec<_> = (0..STREAMS)
        .map(|_| tokio::spawn(download(client.clone(), "/")))
        .collect();
    for d in downloads {
        let got = tokio::time::timeout(LONG_WAIT, d)
            .await
            .expect("in time")
            .expect("task");
        assert_eq!(got.expect("download"), (SIZE, pattern_hash(SIZE)));
    }
    assert_eq!(weir.metric(&web("stalled")), 0);
}

/// A client's RST_STREAM gives the reset stream's bytes back at once, but the stream
/// hands nothing more: the `h2` crate may not read that reset for a long time (it stops
/// decoding while a PING ACK waits for a socket the client does not read), and would
/// hold what the stream hands meanwhile. Was (review of the bound): a PING, then a reset
/// of every stream, and each stream handed up to `max_send_buffer` uncounted, the 32 MiB
/// a connection of the bound's first attack again.
#[tokio::test]
async fn resets_behind_an_unanswered_ping_do_not_undo_the_bound() {
    let (_weir, mut raw, sent) = many_huge_streams_not_read().await;
    assert!(settles(&sent).await, "the upstreams never stopped");
    let before = sent.load(Ordering::Relaxed);
    let mut out = Vec::new();
    frame(&mut out, kind::PING, 0, 0, b"blocking");
    for i in 0..STREAMS {
        frame(
            &mut out,
            kind::RST_STREAM,
            0,
            2 * i + 1,
            &CANCEL.to_be_bytes(),
        );
    }
    raw.send(&out).await.expect("ping and resets");
    assert!(settles(&sent).await, "the upstreams never stopped again");
    let more = sent.load(Ordering::Relaxed) - before;
    // Unbounded, each stream handed its max_send_buffer again: 64 MiB.
    let unbounded = u64::from(STREAMS) * PER_STREAM;
    assert!(
        more < unbounded / 4,
        "after the resets the upstreams sent {} KiB more",
        more >> 10
    );
}

/// Bytes a stream left with the `h2` crate that its reset dropped leave the count: a
/// client that fills the bound with a stream it does not read, resets that stream, then
/// reads, gets its next stream whole on the same connection (were the dropped bytes still
/// counted, the bound would stay full and the next stream would be reset after
/// `stall_timeout`).
#[tokio::test]
async fn a_reset_stream_gives_its_room_back() {
    const SIZE: u64 = 1 << 20;
    let (addr, sent) = counting_backend(1 << 30).await;
    let weir = single(addr)
        .listener("http2 = { max_connection_send_buffer = \"64KiB\", stall_timeout = \"3s\" }")
        .start();
    let mut raw = wide_open_not_reading(weir.addr, &["/a"]).await;
    // Until the upstream is blocked: the bound is full, the socket too.
    assert!(settles(&sent).await, "the upstream never stopped");
    let mut out = Vec::new();
    let flags = flag::END_HEADERS | flag::END_STREAM;
    frame(&mut out, kind::RST_STREAM, 0, 1, &CANCEL.to_be_bytes());
    frame(
        &mut out,
        kind::HEADERS,
        flags,
        3,
        &Block::get("/bytes/1048576").0,
    );
    raw.send(&out).await.expect("reset and request");
    let mut received = 0u64;
    let end = raw
        .until(LONG_WAIT, |f| {
            if f.stream != 3 {
                return None;
            }
            received += f.payload.len() as u64 * u64::from(f.kind == kind::DATA);
            let ended = f.kind == kind::DATA && f.flags & flag::END_STREAM != 0;
            (ended || f.kind == kind::RST_STREAM).then_some(f.kind)
        })
        .await;
    assert_eq!(end, Some(kind::DATA), "stream 3 ended with {end:?}");
    assert_eq!(received, SIZE);
}

/// Streams on the connection of [`many_huge_streams_not_read`].
const STREAMS: u32 = 16;
/// Its `max_send_buffer`: what each of its streams could leave with the `h2` crate.
const PER_STREAM: u64 = 4 << 20;

/// Weir (`max_send_buffer` [`PER_STREAM`], `max_connection_send_buffer` 1 MiB) with a
/// connection of [`wide_open_not_reading`] that asked [`STREAMS`] huge responses of an
/// upstream counting what it sent.
async fn many_huge_streams_not_read() -> (common::Weir, RawH2, Arc<AtomicU64>) {
    let (addr, sent) = counting_backend(1 << 30).await;
    let weir = single(addr)
        .listener("http2 = { max_send_buffer = \"4MiB\", max_connection_send_buffer = \"1MiB\" }")
        .start();
    let paths = vec!["/huge"; STREAMS as usize];
    let raw = wide_open_not_reading(weir.addr, &paths).await;
    (weir, raw, sent)
}

/// A raw connection that never reads (small receive buffer), with windows wide open (the
/// largest RFC 9113 allows, for each stream and the connection), that has sent a GET for
/// each of `paths` on streams 1, 3, 5, ...
async fn wide_open_not_reading(addr: std::net::SocketAddr, paths: &[&str]) -> RawH2 {
    let max = (1u32 << 31) - 1;
    let mut raw = RawH2::connect_not_reading(addr, &[(INITIAL_WINDOW, max)])
        .await
        .expect("connect");
    let mut out = Vec::new();
    let more = (max - 65_535).to_be_bytes();
    frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &more);
    let flags = flag::END_HEADERS | flag::END_STREAM;
    for (i, path) in (0u32..).zip(paths) {
        frame(
            &mut out,
            kind::HEADERS,
            flags,
            2 * i + 1,
            &Block::get(path).0,
        );
    }
    raw.send(&out).await.expect("requests");
    raw
}

/// Waits until the counter `sent` is above 0 and has not moved for a second (upstreams
/// blocked); false when it never settles within `LONG_WAIT`.
async fn settles(sent: &AtomicU64) -> bool {
    let mut last = (0, std::time::Instant::now());
    wait_until_async(LONG_WAIT, || {
        let now = sent.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, std::time::Instant::now());
        }
        now > 0 && last.1.elapsed() > std::time::Duration::from_secs(1)
    })
    .await
}
