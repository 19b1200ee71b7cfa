//! The testkit from plain (non-async) tests: backends on their own threads,
//! the blocking client and the polling helper.

use std::time::{Duration, Instant};

use weir_testkit::{send_raw_once_blocking, status_of, wait_until, Backend, BlockingClient};

#[test]
fn blocking_client_against_echo() {
    let b = Backend::echo("sync");
    let mut c = BlockingClient::connect(b.addr()).unwrap();
    let r = c.request("POST", "/x", &[("X-Y", "z")], b"body").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        "POST /x HTTP/1.1\r\nHost: test\r\nX-Y: z\r\nContent-Length: 4\r\n\r\nbody"
    );
    let r = c.get("/", "h").unwrap();
    assert_eq!(r.header("X-Backend"), Some("sync"));
    assert!(!c.is_closed_by_peer_within(Duration::from_millis(20)));
    assert!(wait_until(Duration::from_secs(30), || b.requests_served() == 2));
    assert_eq!(b.connections_accepted(), 1);

    let raw = send_raw_once_blocking(b.addr(), b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(status_of(&raw), Some(200));
    assert_eq!(b.connections_accepted(), 2);
}

#[test]
fn many_backends_start_and_stop_quickly() {
    let start = Instant::now();
    for _ in 0..20 {
        let b = Backend::slow(Duration::from_secs(60));
        let mut c = BlockingClient::connect(b.addr()).unwrap();
        c.send_raw(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert!(wait_until(Duration::from_secs(30), || b.in_flight() == 1));
        drop(b);
        assert!(c.is_closed_by_peer());
    }
    // Each request would take 60 s: far under 20 of them shows that no drop waited for
    // one, with room for a loaded machine (each backend starts and joins a thread).
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn wait_until_polls_and_times_out() {
    let start = Instant::now();
    let mut n = 0;
    // The first wait's bound is far past the check below: a wait_until that only looked
    // at its condition at the deadline would fail it.
    assert!(wait_until(Duration::from_secs(30), || {
        n += 1;
        n == 3
    }));
    assert!(!wait_until(Duration::from_millis(30), || false));
    // Three 5 ms polls and a 30 ms bound: well under this unless a wait overran, with
    // room for a loaded machine's late wakeups.
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn status_of_parses_first_status_line() {
    assert_eq!(status_of(b"HTTP/1.1 502 Bad Gateway\r\n\r\n"), Some(502));
    assert_eq!(
        status_of(b"HTTP/1.1 503 Unavailable\r\nX: partial"),
        Some(503)
    );
    assert_eq!(status_of(b"HTTP/1.1 20"), None);
    assert_eq!(status_of(b"garbage"), None);
    assert_eq!(status_of(b""), None);
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Backend>();
    send::<weir_testkit::Client>();
    send::<BlockingClient>();
}
