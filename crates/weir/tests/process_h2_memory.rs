//! Memory of the real `weir` process under the HTTP/2 attacks of `h2_attacks.rs`, each
//! mounted on `N` connections held open at once: a header block kept just under its
//! limits (CONTINUATION), HPACK bombs at 4x the header list size, PING, SETTINGS,
//! WINDOW_UPDATE and empty-DATA floods from clients that never read, rapid resets,
//! never-reading downloads and zero-window streams. The growth
//! of VmRSS per attacking connection is printed (recorded in docs/benchmarks.md) and
//! bounded generously (1 MiB per connection), so the test guards against unbounded
//! buffering, not against small changes. VmRSS is read only once Weir has read every
//! attack byte: the kernel's socket queues (`/proc/net/tcp`) show nothing left unread on
//! Weir's side of each attacking connection and nothing unacknowledged on the client's
//! (or Weir closed the connection), plus the attack's own outcome where it has one (the
//! 431 of each HPACK bomb, each download in flight upstream).

mod support_process;

use std::net::SocketAddr;
use std::time::Duration;

use support_process::{config, route_to, Weir};
use weir_testkit::h2_raw::{flag, frame, kind, Block, RawH2};
use weir_testkit::{wait_until_async, Backend};

const N: usize = 64;
const WAIT: Duration = Duration::from_secs(10);
const BOUND_KIB_PER_CONN: u64 = 1024;
const INITIAL_WINDOW: u16 = 0x4;
const CANCEL: u32 = 0x8;

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
        "settings-flood" => {
            for _ in 0..5_000 {
                frame(&mut out, kind::SETTINGS, 0, 0, &[]);
            }
        }
        "window-update-flood" => {
            for _ in 0..5_000 {
                frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes());
            }
        }
        "empty-data-flood" => {
            frame(
                &mut out,
                kind::HEADERS,
                flag::END_HEADERS,
                1,
                &Block::post("/").0,
            );
            for _ in 0..5_000 {
                frame(&mut out, kind::DATA, 0, 1, &[]);
            }
        }
        "rapid-reset" => {
            // Open and cancel streams back to back (CVE-2023-44487).
            let flags = flag::END_HEADERS | flag::END_STREAM;
            for i in 0..500u32 {
                let id = 2 * i + 1;
                frame(&mut out, kind::HEADERS, flags, id, &Block::get("/").0);
                frame(&mut out, kind::RST_STREAM, 0, id, &CANCEL.to_be_bytes());
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

/// `/proc/net/tcp` (IPv4 TCP sockets of this network namespace): by local and remote
/// address, the queued bytes (tx_queue: sent, not yet acknowledged; rx_queue: received,
/// not yet read by the owner).
fn tcp_queues() -> Vec<(SocketAddr, SocketAddr, u64, u64)> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    text.lines().skip(1).filter_map(queue_line).collect()
}

/// One `/proc/net/tcp` line: `sl local rem st tx:rx ...`, addresses as `AABBCCDD:PORT`:
/// the address is the hex of its network-order bytes read as a native-endian `u32` (so
/// the bytes in memory order are the address), the port plain hex.
fn queue_line(line: &str) -> Option<(SocketAddr, SocketAddr, u64, u64)> {
    let mut fields = line.split_whitespace().skip(1);
    let addr = |f: &str| -> Option<SocketAddr> {
        let (ip, port) = f.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        let ip = std::net::Ipv4Addr::from(ip.to_ne_bytes());
        Some(SocketAddr::from((ip, u16::from_str_radix(port, 16).ok()?)))
    };
    let local = addr(fields.next()?)?;
    let remote = addr(fields.next()?)?;
    let (tx, rx) = fields.nth(1)?.split_once(':')?;
    let hex = |v: &str| u64::from_str_radix(v, 16).ok();
    Some((local, remote, hex(tx)?, hex(rx)?))
}

/// True once Weir has read everything each client in `clients` sent: the client's socket
/// has no unacknowledged byte and Weir's side none unread (a side that is gone was closed,
/// after reading or instead of reading: either way nothing more will be processed). Every
/// entry of a connection counts (a handshake's request socket may be listed next to it).
fn attack_read(weir: SocketAddr, clients: &[SocketAddr]) -> bool {
    let queues = tcp_queues();
    clients.iter().all(|&client| {
        let mut entries = queues.iter();
        entries.all(|q| match (q.0, q.1) {
            (from, to) if (from, to) == (client, weir) => q.2 == 0,
            (from, to) if (from, to) == (weir, client) => q.3 == 0,
            _ => true,
        })
    })
}

/// Bytes from `client` waiting unread in Weir's socket.
fn unread(weir: SocketAddr, client: SocketAddr) -> u64 {
    let queues = tcp_queues();
    let mine = queues.iter().filter(|q| (q.0, q.1) == (weir, client));
    mine.map(|q| q.3).sum()
}

/// Resumes a stopped Weir when dropped: a failed assertion (or a timeout) while it is
/// stopped must not leave it stopped and hang the rest of the suite.
struct ContinueOnDrop<'a>(&'a Weir);

impl Drop for ContinueOnDrop<'_> {
    fn drop(&mut self) {
        // No assertion here: a panic while unwinding would abort the test binary.
        support_process::signal_pid(self.0.pid(), libc::SIGCONT);
    }
}

/// The probe is no formality: while Weir is stopped, an attack sits unread in its socket.
async fn probe_sees_unread_bytes(weir: &Weir) {
    weir.signal(libc::SIGSTOP);
    let resume = ContinueOnDrop(weir);
    // The signal is delivered asynchronously: wait until the process is stopped.
    let stat = format!("/proc/{}/stat", weir.pid());
    let stopped = || {
        let text = std::fs::read_to_string(&stat).unwrap_or_default();
        text.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    };
    assert!(wait_until_async(WAIT, stopped).await, "weir stopped");
    let conn = tokio::time::timeout(WAIT, mount(weir.addr, "continuation")).await;
    let conn = conn.expect("the attack was sent to a stopped Weir in time");
    let client = [conn.tcp.local_addr().expect("client address")];
    let seen = wait_until_async(WAIT, || unread(weir.addr, client[0]) > 0).await;
    let read_while_stopped = attack_read(weir.addr, &client);
    drop(resume);
    assert!(
        seen,
        "the attack's bytes arrived, unread, at a stopped Weir"
    );
    assert!(!read_while_stopped, "and the probe says so");
    let read = || attack_read(weir.addr, &client);
    assert!(wait_until_async(WAIT, read).await, "read once resumed");
}

#[tokio::test]
async fn memory_per_connection_stays_bounded_under_http2_attacks() {
    let huge = Backend::huge(1 << 30);
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        "",
        &route_to("huge", "/", huge.addr()),
    ));
    probe_sees_unread_bytes(&weir).await;
    let mut report = Vec::new();
    for what in [
        "continuation",
        "hpack-bomb",
        "ping-flood",
        "settings-flood",
        "window-update-flood",
        "empty-data-flood",
        "rapid-reset",
        "never-reads",
        "zero-window",
    ] {
        let before = weir.proc_status_kib("VmRSS");
        let mut conns = Vec::with_capacity(N);
        for _ in 0..N {
            conns.push(mount(weir.addr, what).await);
        }
        let clients: Vec<SocketAddr> = conns
            .iter()
            .map(|c| c.tcp.local_addr().expect("client address"))
            .collect();
        let read = || attack_read(weir.addr, &clients);
        assert!(wait_until_async(WAIT, read).await, "{what}: bytes unread");
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
