//! Load-balancing policies through the proxy, over real sockets: weighted distribution,
//! least connections, p2c on latency, consistent hashing, sticky cookies, max_connections.

mod upstream_support;

use std::collections::HashMap;

use upstream_support::{backend_of, get_backend, servers, Weir, WAIT};
use weir_testkit::{wait_until, Backend, BlockingClient};

#[test]
fn weighted_round_robin_splits_1_2_3_over_6000_requests() {
    let (a, b, c) = (Backend::echo("a"), Backend::echo("b"), Backend::echo("c"));
    let weir = Weir::start(&format!(
        "[upstreams.app]\nlb = \"weighted_round_robin\"\n{}",
        servers(&[
            (a.addr(), "weight = 1"),
            (b.addr(), "weight = 2"),
            (c.addr(), "weight = 3"),
        ])
    ));
    let mut client = weir.client();
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut run = (String::new(), 0u32);
    for _ in 0..6000 {
        let name = get_backend(&mut client);
        run = if run.0 == name {
            (name.clone(), run.1 + 1)
        } else {
            (name.clone(), 1)
        };
        // Smooth WRR: never more than two picks of the heaviest server in a row.
        assert!(run.1 <= 2, "{} requests in a row to {}", run.1, run.0);
        *counts.entry(name).or_default() += 1;
    }
    for (name, expected) in [("a", 1000.0), ("b", 2000.0), ("c", 3000.0)] {
        let got = f64::from(counts[name]);
        assert!(
            (got - expected).abs() / expected <= 0.02,
            "{name}: {got} of 6000, expected {expected}: {counts:?}"
        );
    }
}

#[test]
fn round_robin_takes_servers_in_turn() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&format!(
        "[upstreams.app]\n{}",
        servers(&[(a.addr(), ""), (b.addr(), "")])
    ));
    let mut client = weir.client();
    let names: Vec<String> = (0..6).map(|_| get_backend(&mut client)).collect();
    assert_eq!(names, ["a", "b", "a", "b", "a", "b"]);
}

/// One request is held by a backend that never answers; least connections then sends
/// every other request to the idle server.
#[test]
fn least_connections_avoids_the_server_holding_a_slow_request() {
    let held = Backend::hang();
    let fast = Backend::echo("fast");
    let weir = Weir::start(&format!(
        "[upstreams.app]\nlb = \"least_connections\"\nresponse_timeout = \"60s\"\n{}",
        servers(&[(held.addr(), ""), (fast.addr(), "")])
    ));
    // Send requests on fresh connections until one is stuck on the hanging server.
    let addr = weir.addr;
    std::thread::spawn(move || loop {
        let Ok(mut c) = BlockingClient::connect(addr) else {
            return;
        };
        match c.get("/", "app.test") {
            Ok(r) if r.status == 200 => continue,
            _ => return,
        }
    });
    assert!(wait_until(WAIT, || held.in_flight() == 1));
    let mut client = weir.client();
    for _ in 0..50 {
        assert_eq!(get_backend(&mut client), "fast");
    }
    assert_eq!(held.requests_served(), 1);
}

#[test]
fn p2c_ewma_sends_most_requests_to_the_faster_server() {
    let slow = Backend::slow(std::time::Duration::from_millis(20));
    let fast = Backend::echo("fast");
    let weir = Weir::start(&format!(
        "[upstreams.app]\nlb = \"p2c_ewma\"\n{}",
        servers(&[(slow.addr(), ""), (fast.addr(), "")])
    ));
    let mut client = weir.client();
    let to_fast = (0..100)
        .filter(|_| get_backend(&mut client) == "fast")
        .count();
    assert!(to_fast >= 80, "{to_fast} of 100 to the fast server");
}

#[test]
fn consistent_hash_on_a_header_pins_each_key() {
    let (_backends, weir) = hashing(3, "", "header:X-User");
    let mut client = weir.client();
    let mut used = std::collections::HashSet::new();
    for user in 0..30 {
        let user = format!("user-{user}");
        let first = client
            .request("GET", "/", &[("X-User", &user)], b"")
            .expect("response");
        for _ in 0..4 {
            let again = client
                .request("GET", "/x", &[("X-User", &user)], b"")
                .expect("response");
            assert_eq!(backend_of(&again), backend_of(&first), "{user}");
        }
        used.insert(backend_of(&first));
    }
    assert!(used.len() >= 2, "keys spread over servers: {used:?}");
}

#[test]
fn sticky_cookie_pins_a_client() {
    let (a, b, c) = (Backend::echo("a"), Backend::echo("b"), Backend::echo("c"));
    let weir = Weir::start(&format!(
        "[upstreams.app]\nlb = \"sticky_cookie\"\nsticky_cookie = \"srv\"\n{}",
        servers(&[(a.addr(), ""), (b.addr(), ""), (c.addr(), "")])
    ));
    let mut client = weir.client();
    let first = client.get("/", "app.test").expect("response");
    let set_cookie = first
        .header("set-cookie")
        .expect("a cookie is set")
        .to_string();
    assert!(set_cookie.starts_with("srv="), "{set_cookie}");
    assert!(set_cookie.contains("Path=/"), "{set_cookie}");
    let cookie = set_cookie
        .split(';')
        .next()
        .expect("name=value")
        .to_string();
    let pinned = backend_of(&first);
    for _ in 0..20 {
        let r = client
            .request(
                "GET",
                "/",
                &[("Cookie", &format!("theme=dark; {cookie}"))],
                b"",
            )
            .expect("response");
        assert_eq!(backend_of(&r), pinned);
        assert_eq!(
            r.header("set-cookie"),
            None,
            "a valid cookie is not set again"
        );
    }
    // Without the cookie, round robin moves on (and sets a cookie again).
    let other = client.get("/", "app.test").expect("response");
    assert_ne!(backend_of(&other), pinned);
    assert!(other.header("set-cookie").is_some());
    // A cookie naming no server is replaced.
    let r = client
        .request("GET", "/", &[("Cookie", "srv=0000000000000000")], b"")
        .expect("response");
    assert!(r.header("set-cookie").is_some());
}

/// `max_connections = 1`: while the one allowed request is held, the server is full; with
/// no other server the next request gets 503.
#[test]
fn max_connections_full_server_is_skipped_then_503() {
    let held = Backend::hang();
    let weir = Weir::start(&format!(
        "[upstreams.app]\nresponse_timeout = \"60s\"\n{}",
        servers(&[(held.addr(), "max_connections = 1")])
    ));
    let addr = weir.addr;
    std::thread::spawn(move || {
        if let Ok(mut c) = BlockingClient::connect(addr) {
            let _ = c.get("/", "app.test");
        }
    });
    assert!(wait_until(WAIT, || held.in_flight() == 1));
    let r = weir.client().get("/", "app.test").expect("response");
    assert_eq!(r.status, 503);
    assert_eq!(r.body_str(), "no healthy upstream server\n");
    assert_eq!(held.requests_served(), 1);
}

#[test]
fn max_connections_overflow_goes_to_another_server() {
    let held = Backend::hang();
    let other = Backend::echo("other");
    let weir = Weir::start(&format!(
        "[upstreams.app]\nresponse_timeout = \"60s\"\n{}",
        servers(&[(held.addr(), "max_connections = 1"), (other.addr(), "")])
    ));
    let addr = weir.addr;
    std::thread::spawn(move || {
        if let Ok(mut c) = BlockingClient::connect(addr) {
            let _ = c.get("/", "app.test");
        }
    });
    assert!(wait_until(WAIT, || held.in_flight() == 1));
    let mut client = weir.client();
    for _ in 0..10 {
        assert_eq!(get_backend(&mut client), "other");
    }
}

/// `hash_key = "path"` hashes the normalised path (the one routed and forwarded), so
/// spellings of one path that the server sees as the same go to the same server.
#[test]
fn consistent_hash_on_the_path_uses_the_normalised_path() {
    let (_backends, weir) = hashing(4, "", "path");
    let mut client = weir.client();
    let mut used = std::collections::HashSet::new();
    for n in 0..12 {
        let plain = client.get(&format!("/a/~x{n}"), "app.test").unwrap();
        for spelling in [
            format!("/a/%7Ex{n}"),
            format!("/a/./~x{n}"),
            format!("/a/b/../%7ex{n}?q=1"),
        ] {
            let again = client.get(&spelling, "app.test").unwrap();
            assert_eq!(backend_of(&again), backend_of(&plain), "{spelling}");
        }
        used.insert(backend_of(&plain));
    }
    assert!(used.len() >= 2, "paths spread over servers: {used:?}");
}

/// Behind `trusted_proxies`, `hash_key = "client_ip"` hashes the client the proxy names in
/// X-Forwarded-For, not the proxy: a front proxy's clients spread over the servers.
#[test]
fn consistent_hash_on_client_ip_uses_the_client_behind_trusted_proxies() {
    let (_backends, weir) = hashing(4, "trusted_proxies = [\"127.0.0.0/8\"]", "client_ip");
    let mut client = weir.client();
    let mut used = std::collections::HashSet::new();
    for n in 0..16 {
        let ip = format!("10.0.{n}.7");
        let first = client
            .request("GET", "/", &[("X-Forwarded-For", &ip)], b"")
            .expect("response");
        let again = client
            .request("GET", "/y", &[("X-Forwarded-For", &ip)], b"")
            .expect("response");
        assert_eq!(backend_of(&again), backend_of(&first), "{ip}");
        used.insert(backend_of(&first));
    }
    assert!(used.len() >= 2, "clients spread over servers: {used:?}");
}

/// `count` echo backends (`a`, `b`, ...) behind Weir hashing `hash_key`, with `listener`
/// keys on its listener.
fn hashing(count: u8, listener: &str, hash_key: &str) -> (Vec<Backend>, Weir) {
    let backends: Vec<_> = (b'a'..b'a' + count)
        .map(|c| Backend::echo(&char::from(c).to_string()))
        .collect();
    let list: Vec<_> = backends.iter().map(|b| (b.addr(), "")).collect();
    let weir = Weir::start_with(
        listener,
        &format!(
            "[upstreams.app]\nlb = \"consistent_hash\"\nhash_key = \"{hash_key}\"\n{}",
            servers(&list)
        ),
    );
    (backends, weir)
}
