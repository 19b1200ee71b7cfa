//! Memory of the real `weir` process under the HTTP/2 attacks of `h2_attacks.rs`, each
//! mounted on `N` connections held open at once: a header block kept just under its
//! limits (CONTINUATION), HPACK bombs at 4x the header list size, PING floods from
//! clients that never read, never-reading downloads and zero-window streams. The growth
//! of VmRSS per attacking connection is printed (recorded in docs/benchmarks.md) and
//! bounded generously (1 MiB per connection), so the test guards against unbounded
//! buffering, not against small changes.

mod support_process;

use std::time::Duration;

use support_process::{config, route_to, Weir};
use weir_testkit::h2_raw::{flag, frame, kind, Block, RawH2};
use weir_testkit::{wait_until_async, Backend};

const N: usize = 64;
const WAIT: Duration = Duration::from_secs(10);
const BOUND_KIB_PER_CONN: u64 = 1024;
const INITIAL_WINDOW: u16 = 0x4;

/// The bytes of one attack on a fresh connection (stream 1).
fn attack(what: &str) -> Vec<u8> {
    let mut out = Vec::new();
    match what {
        "continuation" => {
            // One 60 KB literal split over HEADERS + 3 CONTINUATIONs, never finished:
            // the most a block within max_header_list_size makes Weir hold.
            let block = Block::get("/").literal("x-filler", &[b'a'; 60_000]).0;
            let mut pieces = block.chunks(16_000);
            let first = pieces.next().unwrap_or_default();
            frame(&mut out, kind::HEADERS, 0, 1, first);
            for p in pieces.take(3) {
                frame(&mut out, kind::CONTINUATION, 0, 1, p);
            }
        }
        "hpack-bomb" => {
            // 60 one-byte references to a 4 KB entry: 240 KB decoded, just under 4x.
            let mut block = Block::get("/").literal_add("x-bomb", &[b'b'; 4000]);
            for _ in 0..60 {
                block = block.indexed(62);
            }
            let flags = flag::END_HEADERS | flag::END_STREAM;
            frame(&mut out, kind::HEADERS, flags, 1, &block.0);
        }
        "ping-flood" => {
            for i in 0..5_000u64 {
                frame(&mut out, kind::PING, 0, 0, &i.to_be_bytes());
            }
        }
        _ => {
            // A download: "never-reads" opened its windows, "zero-window" did not.
            let flags = flag::END_HEADERS | flag::END_STREAM;
            frame(&mut out, kind::HEADERS, flags, 1, &Block::get("/huge").0);
        }
    }
    out
}

async fn mount(addr: std::net::SocketAddr, what: &str) -> RawH2 {
    let settings: &[(u16, u32)] = match what {
        "never-reads" => &[(INITIAL_WINDOW, (1 << 31) - 1)],
        "zero-window" => &[(INITIAL_WINDOW, 0)],
        _ => &[],
    };
    let mut raw = RawH2::connect(addr, settings).await.expect("connect");
    if what == "never-reads" {
        let window = ((1u32 << 31) - 1 - 65_535).to_be_bytes();
        raw.send_frame(kind::WINDOW_UPDATE, 0, 0, &window)
            .await
            .expect("window");
    }
    raw.send(&attack(what)).await.expect("attack");
    raw
}

#[tokio::test]
async fn memory_per_connection_stays_bounded_under_http2_attacks() {
    let huge = Backend::huge(1 << 30);
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        "",
        &route_to("huge", "/", huge.addr()),
    ));
    let mut report = Vec::new();
    for what in [
        "continuation",
        "hpack-bomb",
        "ping-flood",
        "never-reads",
        "zero-window",
    ] {
        let before = weir.proc_status_kib("VmRSS");
        let mut conns = Vec::with_capacity(N);
        for _ in 0..N {
            conns.push(mount(weir.addr, what).await);
        }
        if matches!(what, "never-reads" | "zero-window") {
            // Every download reached the upstream, so Weir is buffering what it may.
            let served = huge.requests_served();
            let all = || huge.in_flight() >= N;
            assert!(wait_until_async(WAIT, all).await, "{what}: {served}");
        }
        if what == "hpack-bomb" {
            // Every bomb was decoded and refused (431).
            for c in &mut conns {
                let refused = c
                    .until(WAIT, |f| {
                        (f.stream == 1 && f.kind == kind::HEADERS).then_some(())
                    })
                    .await;
                assert_eq!(refused, Some(()), "{what}");
            }
        }
        let during = weir.proc_status_kib("VmRSS");
        let per_conn = during.saturating_sub(before) / N as u64;
        report.push(format!(
            "{what}: VmRSS {before} -> {during} KiB with {N} connections, {per_conn} KiB each"
        ));
        assert!(
            per_conn < BOUND_KIB_PER_CONN,
            "{what}: {per_conn} KiB per connection"
        );
        drop(conns);
        assert!(wait_until_async(WAIT, || huge.in_flight() == 0).await);
    }
    let hwm = weir.proc_status_kib("VmHWM");
    eprintln!("{}\nVmHWM {hwm} KiB", report.join("\n"));
}
