//! Retries through the proxy: failover under load without failed requests, only safe
//! replays (a POST whose body was sent is never replayed), retries on configured statuses,
//! connect errors retried for any method, and the retry budget.

mod upstream_support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use upstream_support::{backend_of, get_backend, servers, Weir, WAIT};
use weir_testkit::{wait_until, Backend, BlockingClient};

/// A port where connecting is refused: a socket bound but not listening, held for as
/// long as the value lives.
fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let addr = socket.local_addr().expect("address");
    (socket, addr)
}

#[test]
fn failover_under_load_has_no_failed_requests() {
    let a = Backend::echo("a");
    let b = Backend::echo("b");
    let c = Backend::echo("c");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}[upstreams.app.retry]\nattempts = 2\n",
        servers(&[(a.addr(), ""), (b.addr(), ""), (c.addr(), "")])
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, done, failed, addr) =
                (stop.clone(), done.clone(), failed.clone(), weir.addr);
            std::thread::spawn(move || {
                let mut client = BlockingClient::connect(addr).expect("connect");
                client.set_timeout(WAIT);
                while !stop.load(Ordering::SeqCst) {
                    match client.get("/", "app.test") {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) => {
                            eprintln!("failed request: {} {}", r.status, r.body_str());
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            eprintln!("failed request: {e}");
                            failed.fetch_add(1, Ordering::SeqCst);
                            client = BlockingClient::connect(addr).expect("reconnect");
                            client.set_timeout(WAIT);
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    assert!(wait_until(WAIT, || done.load(Ordering::SeqCst) >= 300));
    let b_served = b.requests_served();
    assert!(b_served > 0, "b took part before it was killed");
    drop(b);
    let at_kill = done.load(Ordering::SeqCst);
    assert!(wait_until(WAIT, || done.load(Ordering::SeqCst) >= at_kill + 1000));
    stop.store(true, Ordering::SeqCst);
    for t in clients {
        t.join().expect("client thread");
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "retries absorb the killed server"
    );
    assert!(
        weir.retries() >= 1,
        "the killed server's failures were retried"
    );
    assert!(a.requests_served() > 300 && c.requests_served() > 300);
}

/// The reset backend reads a request head and resets the connection without answering.
/// A GET is replayed on the other server; a POST whose body went out is not.
#[test]
fn a_post_whose_body_was_sent_is_not_replayed() {
    let reset = Backend::reset();
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}[upstreams.app.passive]\nmax_fails = 0\n\
         [upstreams.app.retry]\nattempts = 1\n\
         on = [\"connect_error\", \"reset_before_response\", \"timeout\", \"502\", \"503\", \"504\"]\n",
        servers(&[(reset.addr(), ""), (echo.addr(), "")])
    ));
    // Round robin: the GET goes to the reset server first, its retry to echo.
    let r = weir.client().get("/", "app.test").expect("response");
    assert_eq!((r.status, backend_of(&r).as_str()), (200, "echo"));
    assert_eq!((reset.requests_served(), echo.requests_served()), (1, 1));
    // The POST goes to the reset server and fails there.
    let r = weir
        .client()
        .request("POST", "/orders", &[], b"{\"item\": 1}")
        .expect("response");
    assert_eq!(r.status, 502);
    assert!(wait_until(WAIT, || reset.requests_served() == 2));
    assert_eq!(echo.requests_served(), 1, "the POST was not replayed");
    assert_eq!(weir.retries(), 1);
}

#[test]
fn a_configured_status_is_retried_on_another_server() {
    let unavailable = Backend::fixed(503, &[], "busy\n");
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}[upstreams.app.passive]\nmax_fails = 0\n\
         [upstreams.app.retry]\non = [\"503\"]\n",
        servers(&[(unavailable.addr(), ""), (echo.addr(), "")])
    ));
    let mut client = weir.client();
    // Round robin: first to the 503 server, retried on echo.
    assert_eq!(get_backend(&mut client), "echo");
    assert_eq!(unavailable.requests_served(), 1);
    // The retry moved the cursor on: the POST goes to the 503 server, and is not replayed
    // (it may have been processed).
    let r = client.request("POST", "/", &[], b"x").expect("response");
    assert_eq!(r.status, 503);
    assert_eq!(unavailable.requests_served(), 2);
    assert_eq!(echo.requests_served(), 1);
}

#[test]
fn a_connect_error_is_retried_even_for_a_post() {
    let (_socket, dead) = refusing_port();
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}",
        servers(&[(dead, ""), (echo.addr(), "")])
    ));
    let r = weir
        .client()
        .request("POST", "/", &[], b"payload")
        .expect("response");
    assert_eq!((r.status, backend_of(&r).as_str()), (200, "echo"));
    assert!(r.body_str().ends_with("payload"));
}

/// A POST whose body comes after its head is streamed; when its first server refuses the
/// connection, the retry on the next server must send the whole body, and the rest of the
/// body must never be read as the client's next request (a desync).
#[test]
fn a_streamed_post_retried_after_a_connect_error_sends_its_whole_body() {
    let (_socket, dead) = refusing_port();
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\nresponse_timeout = \"5s\"\n{}",
        servers(&[(dead, ""), (echo.addr(), "")])
    ));
    let mut client = weir.client();
    // A body that is itself a request: lost from the upload, it would be served as one.
    let body = "GET /smuggled HTTP/1.1\r\nHost: app.test\r\n\r\n";
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    client.send_raw(head.as_bytes()).expect("head");
    // Round robin: the dead server first; the body goes once Weir has moved on to echo.
    assert!(
        wait_until(WAIT, || weir.retries() == 1),
        "the connect error was retried"
    );
    client.send_raw(body.as_bytes()).expect("body");
    let r = client.read_response(false).expect("response");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(
        r.body_str().ends_with(body),
        "echo got the whole body: {}",
        r.body_str()
    );
}

/// One server always answers 503; with `budget_percent = 20`, at most the burst (10) plus
/// 20% of the requests are retried, the rest get the 503.
#[test]
fn the_retry_budget_caps_retries() {
    let unavailable = Backend::fixed(503, &[], "busy\n");
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}[upstreams.app.passive]\nmax_fails = 0\n\
         [upstreams.app.retry]\non = [\"503\"]\nbudget_percent = 20\n",
        servers(&[(unavailable.addr(), ""), (echo.addr(), "")])
    ));
    let mut client = weir.client();
    let mut answered_503 = 0;
    for _ in 0..200 {
        let r = client.get("/", "app.test").expect("response");
        if r.status == 503 {
            answered_503 += 1;
        }
    }
    let retries = weir.retries() as usize;
    let (u, e) = (unavailable.requests_served(), echo.requests_served());
    assert!(retries <= 10 + 40, "{retries} retries for 200 requests");
    assert!(retries >= 40, "the budget refills: {retries}");
    assert_eq!(u + e, 200 + retries, "only retries add attempts");
    assert_eq!(
        answered_503,
        u - retries,
        "every first attempt on the 503 server not retried"
    );
    assert!(answered_503 > 0, "the budget ran out");
}

/// A status counts against a server (passive ejection) only when the pool retries it,
/// as nginx counts only `proxy_next_upstream`'s cases. Was: any 502/503/504 the
/// application answered ejected its server, so one request a URL answers 503 for
/// (maintenance, a dependency down) per server and `fail_timeout` let any client push
/// all the load onto one server (attacker review).
#[test]
fn an_application_status_ejects_its_server_only_when_the_pool_retries_it() {
    for (retry, ejected) in [
        ("", false),
        ("[upstreams.app.retry]\non = [\"503\"]\n", true),
    ] {
        let unavailable = Backend::fixed(503, &[], "busy\n");
        let echo = Backend::echo("echo");
        let weir = Weir::start(&format!(
            "[upstreams.app]\n{}[upstreams.app.passive]\nmax_fails = 1\n\
             fail_timeout = \"60s\"\n{retry}",
            servers(&[(unavailable.addr(), ""), (echo.addr(), "")])
        ));
        let mut client = weir.client();
        for _ in 0..6 {
            client.get("/", "app.test").expect("response");
        }
        // Round robin: every other request while the 503 server is in; one (the first,
        // then retried on echo) once its 503 ejected it.
        let expected = if ejected { 1 } else { 3 };
        assert_eq!(unavailable.requests_served(), expected, "{retry:?}");
    }
}

/// A response head past Weir's bounds is a 502 that does not count against the server:
/// an application reflecting the request into its head (a long `Location`) would
/// otherwise let any client eject it with one long request (attacker review).
#[test]
fn a_response_head_too_large_does_not_eject_its_server() {
    let big = format!(
        "HTTP/1.1 302 Found\r\nLocation: /{}\r\nContent-Length: 0\r\n\r\n",
        "x".repeat(17 * 1024)
    );
    let reflecting = Backend::raw_response(big.as_bytes());
    let echo = Backend::echo("echo");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}[upstreams.app.passive]\nmax_fails = 1\nfail_timeout = \"60s\"\n",
        servers(&[(reflecting.addr(), ""), (echo.addr(), "")])
    ));
    let mut client = weir.client();
    let statuses: Vec<u16> = (0..4)
        .map(|_| client.get("/", "app.test").expect("response").status)
        .collect();
    // Round robin, the reflecting server kept in: 502, 200, 502, 200.
    assert_eq!(statuses, [502, 200, 502, 200]);
    assert_eq!(reflecting.requests_served(), 2);
}
