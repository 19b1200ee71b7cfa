//! Active health checks through the proxy: a failing server is marked down after `fall`
//! checks and gets no requests, comes back after `rise`; backups take over while every
//! primary is down; no server up means 503. Check intervals are 50 ms; the tests poll for
//! state changes and never assert on timing.

mod upstream_support;

use upstream_support::{get_backend, servers, Switchable, Weir, WAIT};
use weir_testkit::{wait_until, Backend};

/// `[upstreams.app.health_check]` at 50 ms, and no slow start (so a returning server gets
/// its share at once). Every failure these tests cause is an answer (503, a refused
/// connection, NOT_SERVING), never a timeout: the check timeout is long so that a slow
/// answer on a loaded machine cannot mark a healthy server down (with `fall = 1`, one
/// check over 500 ms would).
fn checks(kind: &str, rise: u32, fall: u32) -> String {
    let path = match kind {
        "http" => "path = \"/healthz\"\n",
        // The testkit's gRPC health service knows "known".
        "grpc" => "service = \"known\"\n",
        _ => "",
    };
    format!(
        "[upstreams.app.health_check]\nkind = \"{kind}\"\n{path}interval = \"50ms\"\n\
         timeout = \"5s\"\nrise = {rise}\nfall = {fall}\n\
         [upstreams.app.passive]\nslow_start = \"0s\"\n"
    )
}

#[test]
fn a_failing_server_is_marked_down_after_fall_checks_and_back_after_rise() {
    let flaky = Switchable::start("flaky");
    let steady = Backend::echo("steady");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}{}",
        servers(&[(flaky.addr, ""), (steady.addr(), "")]),
        checks("http", 2, 3)
    ));
    let mut client = weir.client();
    assert!(weir.server_up(0));
    assert!(wait_until(WAIT, || flaky.health_checks() >= 1));

    let before = flaky.health_checks();
    flaky.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(0)), "marked down");
    assert!(
        flaky.health_checks() - before >= 3,
        "down only after fall = 3 failed checks"
    );
    let served = flaky.requests();
    for _ in 0..30 {
        assert_eq!(get_backend(&mut client), "steady");
    }
    assert_eq!(flaky.requests(), served, "a down server gets no requests");

    let before = flaky.health_checks();
    flaky.set_healthy(true);
    assert!(wait_until(WAIT, || weir.server_up(0)), "marked up again");
    assert!(
        flaky.health_checks() - before >= 2,
        "up only after rise = 2 good checks"
    );
    assert!(wait_until(WAIT, || get_backend(&mut client) == "flaky"));
}

#[test]
fn tcp_check_marks_a_stopped_server_down() {
    let gone = Backend::echo("gone");
    let steady = Backend::echo("steady");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}{}",
        servers(&[(gone.addr(), ""), (steady.addr(), "")]),
        checks("tcp", 1, 2)
    ));
    drop(gone);
    assert!(wait_until(WAIT, || !weir.server_up(0)), "marked down");
    let mut client = weir.client();
    for _ in 0..20 {
        assert_eq!(get_backend(&mut client), "steady");
    }
    assert!(weir.server_up(1));
}

#[test]
fn no_server_up_means_503_with_a_clear_body() {
    let only = Switchable::start("only");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}{}",
        servers(&[(only.addr, "")]),
        checks("http", 1, 1)
    ));
    let mut client = weir.client();
    assert_eq!(get_backend(&mut client), "only");
    only.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(0)));
    let served = only.requests();
    let r = weir.client().get("/", "app.test").expect("response");
    assert_eq!(r.status, 503);
    assert_eq!(r.body_str(), "no healthy upstream server\n");
    assert_eq!(only.requests(), served);
    only.set_healthy(true);
    assert!(wait_until(WAIT, || weir.server_up(0)));
    assert_eq!(get_backend(&mut weir.client()), "only");
}

#[test]
fn backup_takes_over_while_every_primary_is_down() {
    let p1 = Switchable::start("p1");
    let p2 = Switchable::start("p2");
    let backup = Switchable::start("backup");
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}{}",
        servers(&[(p1.addr, ""), (backup.addr, "backup = true"), (p2.addr, "")]),
        checks("http", 1, 1)
    ));
    let mut client = weir.client();
    for _ in 0..10 {
        assert_ne!(get_backend(&mut client), "backup");
    }
    p1.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(0)));
    for _ in 0..10 {
        assert_eq!(get_backend(&mut client), "p2", "one primary is still up");
    }
    p2.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(2)));
    for _ in 0..10 {
        assert_eq!(get_backend(&mut client), "backup");
    }
    p2.set_healthy(true);
    assert!(wait_until(WAIT, || weir.server_up(2)));
    let backup_served = backup.requests();
    for _ in 0..10 {
        assert_eq!(get_backend(&mut client), "p2", "primaries take over again");
    }
    assert_eq!(backup.requests(), backup_served);
    backup.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(1)));
    p2.set_healthy(false);
    assert!(wait_until(WAIT, || !weir.server_up(2)));
    let r = weir.client().get("/", "app.test").expect("response");
    assert_eq!(r.status, 503, "no primary and no backup up");
}

/// `kind = "grpc"` checks on an h2c upstream: weir-testkit's `H2Backend` serves
/// grpc.health.v1 (hand-written messages); NOT_SERVING marks the server down, SERVING up.
#[test]
fn grpc_check_follows_the_serving_status() {
    let grpc = weir_testkit::H2Backend::h2c();
    let steady = weir_testkit::H2Backend::h2c();
    let weir = Weir::start(&format!(
        "[upstreams.app]\nprotocol = \"h2c\"\n{}{}",
        servers(&[(grpc.addr(), ""), (steady.addr(), "")]),
        checks("grpc", 1, 2)
    ));
    assert!(wait_until(WAIT, || grpc.health_checks() >= 2), "checks run");
    assert!(weir.server_up(0));
    grpc.set_serving(false);
    assert!(wait_until(WAIT, || !weir.server_up(0)), "NOT_SERVING: down");
    assert!(weir.server_up(1), "the other server stays up");
    grpc.set_serving(true);
    assert!(wait_until(WAIT, || weir.server_up(0)), "SERVING: up again");
}

#[test]
fn grpc_check_of_an_unknown_service_marks_the_server_down() {
    let grpc = weir_testkit::H2Backend::h2c();
    let steady = weir_testkit::H2Backend::h2c();
    let weir = Weir::start(&format!(
        "[upstreams.app]\nprotocol = \"h2c\"\n{}{}",
        servers(&[(grpc.addr(), ""), (steady.addr(), "")]),
        checks("grpc", 1, 1).replace("\"known\"", "\"other.Service\"")
    ));
    assert!(wait_until(WAIT, || !weir.server_up(0)), "NOT_FOUND: down");
    assert!(grpc.health_checks() >= 1);
}

/// `kind = "http"` checks of an h2c upstream are HTTP/2 requests (its servers need speak
/// nothing else): a server answering 200 stays up, one answering 503 is marked down.
#[test]
fn http_check_of_an_h2c_upstream_speaks_http2() {
    let good = weir_testkit::H2Backend::h2c();
    let failing = weir_testkit::H2Backend::fixed(503, &[], "down");
    let weir = Weir::start(&format!(
        "[upstreams.app]\nprotocol = \"h2c\"\n{}{}",
        servers(&[(good.addr(), ""), (failing.addr(), "")]),
        checks("http", 1, 1)
    ));
    assert!(wait_until(WAIT, || !weir.server_up(1)), "503: down");
    assert!(wait_until(WAIT, || good.streams() >= 2), "checks reach it");
    assert!(weir.server_up(0), "200 over HTTP/2: up");
}
