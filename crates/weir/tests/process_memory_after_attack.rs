//! Memory of the real `weir` process after an HTTP/2 zero-window attack: 20 connections
//! with 100 streams each, every stream a 1 MiB download from a client that opened no
//! window and never reads, then closes. Weir buffers what its bounds allow for each stream
//! meanwhile; once the attackers are gone, its RSS must come back near where it was idle
//! (issue 24: it stayed at ~100 MiB). The figures (idle, peak, and the RSS each second
//! after the attack) are printed and recorded in docs/benchmarks.md.

mod support_process;

use std::time::{Duration, Instant};

use support_process::{config, get, route_to, Weir};
use weir_testkit::h2_raw::{flag, kind, Block, RawH2};
use weir_testkit::{wait_until_async, Backend};

/// Attacking connections, with `STREAMS` streams each: Weir holds 2,020 connections at
/// once (the descriptor limit here and on CI is 20,000).
const CONNECTIONS: usize = 20;
const STREAMS: u32 = 100;
const INITIAL_WINDOW: u16 = 0x4;
const WARM_UP: usize = 4;
/// How long the attack may take to reach every stream, and the upstream to see them go.
const WAIT: Duration = Duration::from_secs(60);
/// How long RSS may take to come back after the attack (the figure).
const SETTLE: Duration = Duration::from_secs(60);
/// "Near idle": at most this much above the idle RSS. The attack's peak is several times
/// that; what is left is the allocator's and the runtime's high-water structures.
const SLACK_KIB: u64 = 16 * 1024;

/// One attacking connection: SETTINGS_INITIAL_WINDOW_SIZE 0, then `STREAMS` GETs.
async fn attack(addr: std::net::SocketAddr) -> RawH2 {
    let mut raw = RawH2::connect_not_reading(addr, &[(INITIAL_WINDOW, 0)])
        .await
        .expect("connect");
    let flags = flag::END_HEADERS | flag::END_STREAM;
    for i in 0..STREAMS {
        let block = Block::get("/").0;
        raw.send_frame(kind::HEADERS, flags, 2 * i + 1, &block)
            .await
            .expect("request");
    }
    raw
}

/// Polls VmRSS every `step` until `done` says so or `limit` passes; every reading.
async fn rss_until(
    weir: &Weir,
    step: Duration,
    limit: Duration,
    mut done: impl FnMut(&[u64]) -> bool,
) -> Vec<u64> {
    let start = Instant::now();
    let mut seen = vec![weir.proc_status_kib("VmRSS")];
    while !done(&seen) && start.elapsed() < limit {
        tokio::time::sleep(step).await;
        seen.push(weir.proc_status_kib("VmRSS"));
    }
    seen
}

#[tokio::test]
async fn rss_comes_back_near_idle_within_a_minute_after_a_zero_window_attack() {
    let huge = Backend::huge(1 << 20);
    // 2,000 upstream connections come at once: the test backend queues them (a backlog
    // of 4,096), and a connect slowed by the busy machine must still not fail.
    let upstream = "connect_timeout = \"30s\"\n[upstreams.huge.passive]\nmax_fails = 0\n";
    let text = config("", "", &(route_to("huge", "/", huge.addr()) + upstream));
    let weir = Weir::start(&text.replace("workers = 1", "workers = 2"));
    // Idle after a little ordinary traffic (an idle process never touched some pools).
    for _ in 0..WARM_UP {
        get(weir.addr, "/").expect("warm-up request");
    }
    let idle = weir.proc_status_kib("VmRSS");
    let idle_fds = weir.open_fds();

    let mut conns = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        conns.push(attack(weir.addr).await);
    }
    // Every download was answered upstream (1 MiB fits the socket buffers between the
    // backend and Weir, so the backend may be done with it while Weir holds it).
    let all = WARM_UP + CONNECTIONS * STREAMS as usize;
    let reached = wait_until_async(WAIT, || huge.requests_served() >= all).await;
    assert!(
        reached,
        "{} of {all} requests upstream",
        huge.requests_served()
    );
    // The peak: RSS has stopped growing for a second (every stream's buffer is full).
    let grown = rss_until(&weir, Duration::from_millis(250), WAIT, |s| {
        s.len() > 4 && s[s.len() - 5..].windows(2).all(|w| w[1] <= w[0])
    })
    .await;
    let peak = grown.iter().copied().max().unwrap_or(0);

    drop(conns);
    // Weir closed the attack's 2,020 connections (a few descriptors of slack: the idle
    // pool's upstream connections from the warm-up may come and go).
    let gone = wait_until_async(WAIT, || weir.open_fds() <= idle_fds + 4).await;
    assert!(
        gone,
        "{} descriptors open, {idle_fds} when idle",
        weir.open_fds()
    );
    let ended = Instant::now();
    let bound = idle + SLACK_KIB;
    let after = rss_until(&weir, Duration::from_secs(1), SETTLE, |s| {
        s.last().is_some_and(|&r| r <= bound)
    })
    .await;
    let last = after.last().copied().unwrap_or(0);
    eprintln!(
        "zero-window attack, {CONNECTIONS} x {STREAMS} streams of 1 MiB: VmRSS idle {idle} KiB, \
         peak {peak} KiB, {last} KiB {:.1} s after the attack (readings each second: {after:?})",
        ended.elapsed().as_secs_f64()
    );
    assert!(peak > bound, "the attack took memory: peak {peak} KiB");
    assert!(
        last <= bound,
        "VmRSS {last} KiB {} s after the attack: over idle ({idle} KiB) + {SLACK_KIB} KiB",
        after.len() - 1
    );
}
