//! SIGTERM / SIGINT: Weir stops accepting, lets the request in flight finish, exits 0 within
//! drain_timeout.

mod support_process;

use std::io::Write;
use std::time::{Duration, Instant};

use support_process::{config, connect, read_response, refused, route_to, Weir};
use weir_testkit::{wait_until, Backend};

const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The request stays in flight deterministically: the client sends the head and half the
/// body, so neither Weir nor the backend can finish it until the test sends the rest.
fn drain_with(sig: libc::c_int) {
    let backend = Backend::slow(Duration::from_secs(1));
    let mut weir = Weir::start(&config(
        "drain_timeout = \"30s\"",
        "",
        &route_to("slow", "/", backend.addr()),
    ));
    let addr = weir.addr;

    let mut client = connect(addr, Duration::from_secs(2)).unwrap();
    client
        .write_all(b"POST /drain HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\nhello")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || backend.in_flight() == 1),
        "the request reaches the backend"
    );

    let signalled = Instant::now();
    weir.signal(sig);
    assert!(
        weir.log
            .wait_for("signal received", Duration::from_secs(10)),
        "{}",
        weir.log.text()
    );
    // New connections are refused while the request is still in flight.
    assert!(
        wait_until(Duration::from_secs(10), || refused(addr)),
        "the listener closes on {sig}"
    );
    assert!(
        weir.wait_exit(Duration::from_millis(200)).is_none(),
        "still draining"
    );
    assert_eq!(backend.in_flight(), 1, "the request is still in flight");

    // The in-flight request completes.
    client.write_all(b"world").unwrap();
    let (head, body) = read_response(&mut client).expect("the in-flight request is answered");
    assert_eq!(head.status, 200);
    assert!(body.ends_with(b"\r\n\r\nhelloworld"), "{body:?}");
    assert!(body.starts_with(b"POST /drain HTTP/1.1\r\n"));
    // The keep-alive decision was taken before the signal, so the head may not say
    // `Connection: close`; the connection is closed right after the response all the same.
    let mut rest = [0u8; 64];
    let n = std::io::Read::read(&mut client, &mut rest).unwrap_or(0);
    assert_eq!(
        n, 0,
        "a draining Weir closes the client connection after the response"
    );

    let status = weir
        .wait_exit(DRAIN_TIMEOUT / 2)
        .expect("exits well within drain_timeout");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        signalled.elapsed() < DRAIN_TIMEOUT / 2,
        "took {:?}",
        signalled.elapsed()
    );
    // The exit can be seen before the log reader has read the last stderr line: poll.
    assert!(
        weir.log.wait_for("stopped", Duration::from_secs(5)),
        "{}",
        weir.log.text()
    );
    assert!(refused(addr));
}

#[test]
fn sigterm_drains_in_flight_request_and_exits_0() {
    drain_with(libc::SIGTERM);
}

#[test]
fn sigint_drains_too() {
    drain_with(libc::SIGINT);
}

/// Idle keep-alive connections do not hold the drain up: Weir closes them and exits at once.
#[test]
fn idle_keepalive_connections_do_not_delay_exit() {
    let backend = Backend::echo("e");
    let mut weir = Weir::start(&config(
        "drain_timeout = \"30s\"",
        "keepalive_timeout = \"60s\"",
        &route_to("e", "/", backend.addr()),
    ));
    let mut idle: Vec<_> = (0..3)
        .map(|_| {
            let mut s = connect(weir.addr, Duration::from_secs(2)).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
                .unwrap();
            let (head, _) = read_response(&mut s).unwrap();
            assert_eq!(head.status, 200);
            s
        })
        .collect();
    weir.signal(libc::SIGTERM);
    let status = weir
        .wait_exit(Duration::from_secs(10))
        .expect("exits without waiting for drain_timeout");
    assert!(status.success(), "{status:?}");
    for s in &mut idle {
        let mut buf = [0u8; 16];
        let n = std::io::Read::read(s, &mut buf).unwrap_or(0);
        assert_eq!(n, 0, "idle connection closed");
    }
}

/// A request that outlives drain_timeout is cut off; Weir still exits 0.
#[test]
fn drain_timeout_bounds_the_wait() {
    let backend = Backend::hang();
    let mut weir = Weir::start(&config(
        "drain_timeout = \"500ms\"",
        "",
        &route_to("h", "/", backend.addr()),
    ));
    let mut client = connect(weir.addr, Duration::from_secs(2)).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || backend.in_flight() == 1));
    weir.signal(libc::SIGTERM);
    let status = weir
        .wait_exit(Duration::from_secs(15))
        .expect("exits after drain_timeout");
    assert!(status.success(), "{status:?}");
    assert!(
        weir.log
            .wait_for("drain_timeout reached", Duration::from_secs(5)),
        "{}",
        weir.log.text()
    );
}
