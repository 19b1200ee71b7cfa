//! `max_connections`: at the limit, with every connection in the middle of a request,
//! Weir stops accepting; a further connection waits, unanswered, until one of the open
//! connections closes, and is then served. An idle connection gives way at once instead:
//! the newcomer takes its place.

mod support_process;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support_process::{config, connect, get_on, read_response, route_to, Weir};
use weir_testkit::Backend;

const LIMIT: usize = 4;

/// Sends a request on a new connection; asserts it gets no response within half a second.
fn waiting(weir: &Weir, path: &str) -> TcpStream {
    let mut s = connect(weir.addr, Duration::from_secs(2)).expect("backlog accepts");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    match read_response(&mut s) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("{path} must get no response yet: {other:?}"),
    }
    // A blocking read bounded by a generous timeout from here on: no timing is asserted.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn a_connection_over_the_limit_waits_for_a_close_or_takes_an_idle_ones_place() {
    let backend = Backend::echo("e");
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        &format!(
            "max_connections = {LIMIT}\nkeepalive_timeout = \"60s\"\nheader_timeout = \"60s\""
        ),
        &route_to("e", "/", backend.addr()),
    ));
    // Four connections in the middle of a request head from their first bytes, so never
    // idle. Accepted in the order they came (one worker, TCP_DEFER_ACCEPT: once their bytes
    // are in), before the fifth.
    let mut held: Vec<TcpStream> = (0..LIMIT)
        .map(|_| {
            let mut s = connect(weir.addr, Duration::from_secs(2)).unwrap();
            s.write_all(b"GET /still HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let mut fifth = waiting(&weir, "/fifth");

    // One closes: the fifth is accepted and its request (already sent) answered.
    drop(held.pop());
    let (head, body) = read_response(&mut fifth).expect("the fifth is served once one closes");
    assert_eq!(head.status, 200);
    assert!(body.starts_with(b"GET /fifth HTTP/1.1\r\n"), "{body:?}");

    // The fifth is now idle: a sixth takes its place at once, and the fifth is closed.
    let mut sixth = connect(weir.addr, Duration::from_secs(2)).unwrap();
    sixth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (head, _) = get_on(&mut sixth, "/sixth").expect("served in the idle one's place");
    assert_eq!(head.status, 200);
    fifth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        fifth.read(&mut [0u8; 16]).ok(),
        Some(0),
        "the idle fifth is closed"
    );

    // The heads in progress were never taken: they finish and are served.
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"Host: test\r\n\r\n").unwrap();
        let (head, _) = read_response(s).expect("a request in progress keeps its place");
        assert_eq!(head.status, 200);
    }
}
