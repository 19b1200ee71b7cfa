//! A listener's `max_connections` with several workers: it is one cap for the listener,
//! reachable however the kernel's SO_REUSEPORT hash spreads connections over the workers'
//! sockets; at the cap, with no idle connection to close for a newcomer (each is in the
//! middle of a request; idle ones give way, see `listener_idle_reclaim`), the workers pause
//! accepting (`weir_accept_paused_total`) and resume when a connection closes on any
//! worker.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Conf, Weir, WAIT};
use weir_testkit::wait_until;

const CAP: usize = 4;
const WORKERS: usize = 2;
/// Rounds of `CAP` new connections. A fixed share per worker (2 each) serves a round only
/// when the hash splits it 2/2 (6 of 16 splits): all rounds pass that way with a
/// probability of (6/16)^8, about 1 in 2,500.
const ROUNDS: usize = 8;

fn start() -> Weir {
    Conf::new()
        .workers(WORKERS)
        .listener(&format!("max_connections = {CAP}"))
        .listener("header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"")
        .listener("default_response = { status = 404, body = \"none\\n\" }")
        .start()
}

/// A keep-alive request on `s`; whether a whole response came within `within`.
fn answered(s: &mut TcpStream, within: Duration) -> bool {
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"none\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got.starts_with(b"HTTP/1.1 404")
}

/// `CAP` new connections, each proven accepted by an answered request.
fn open_served(weir: &Weir, round: usize) -> Vec<TcpStream> {
    let active = "weir_connections_active{listener=\"web\"}";
    // The previous round's connections are closed: wait until Weir saw every close.
    assert!(
        wait_until(WAIT, || weir.metric(active) == 0),
        "round {round}"
    );
    let mut held: Vec<TcpStream> = (0..CAP)
        .map(|_| TcpStream::connect(weir.addr).unwrap())
        .collect();
    for (i, s) in held.iter_mut().enumerate() {
        // Only a connection left in a backlog waits this long (a hang, not a timing).
        assert!(
            answered(s, WAIT),
            "round {round}: connection {i} of {CAP} was not served under the cap"
        );
    }
    held
}

#[test]
fn the_cap_is_reached_whatever_the_spread_over_workers_and_resumes_across_them() {
    let weir = start();
    for round in 0..ROUNDS {
        drop(open_served(&weir, round));
    }
    // At the cap, each connection in the middle of a request head from its first bytes, so
    // never idle (idle ones would give way, see `listener_idle_reclaim`): a further
    // connection waits, and its worker pauses.
    let active = "weir_connections_active{listener=\"web\"}";
    assert!(wait_until(WAIT, || weir.metric(active) == 0));
    let mut held: Vec<TcpStream> = (0..CAP)
        .map(|_| {
            let mut s = TcpStream::connect(weir.addr).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    assert!(wait_until(WAIT, || weir.metric(active) == CAP as u64));
    let mut over = TcpStream::connect(weir.addr).unwrap();
    assert!(
        !answered(&mut over, Duration::from_millis(300)),
        "served over the cap"
    );
    let paused = "weir_accept_paused_total{listener=\"web\"}";
    assert!(wait_until(WAIT, || weir.metric(paused) > 0));
    assert_eq!(
        weir.metric("weir_connections_evicted_total{listener=\"web\"}"),
        0
    );
    // A close on whichever worker lets it in (its request is answered once accepted).
    drop(held.pop());
    let mut rest = Vec::new();
    over.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 512];
    while !rest.ends_with(b"none\n") {
        let n = over.read(&mut buf).expect("served after a close");
        assert!(n > 0, "closed instead of served");
        rest.extend_from_slice(&buf[..n]);
    }
    assert!(rest.starts_with(b"HTTP/1.1 404"));
}
