//! Applying a new config to a running Weir (in process, through `Proxy::apply`, the path
//! SIGHUP and the admin API share): routes and upstreams switch for new requests while a
//! request in flight finishes where it started; listeners come and go; metrics keep
//! counting by name across any reshuffle; unreloadable changes are refused.

mod common;

use std::time::Duration;

use common::{Conf, WAIT};
use weir_testkit::{wait_until, Backend, BlockingClient};

fn get(addr: std::net::SocketAddr, path: &str) -> weir_testkit::Response {
    let mut c = BlockingClient::connect(addr).expect("connect");
    c.set_timeout(WAIT);
    c.get(path, "test").expect("response")
}

/// The value of the first metrics line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_route_change_applies_to_the_next_request() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let conf = |to: &str| {
        Conf::new()
            .route("all", to, &[])
            .upstream("a", &[a.addr()], &[])
            .upstream("b", &[b.addr()], &[])
    };
    let weir = conf("a").start();
    let mut kept = BlockingClient::connect(weir.addr).expect("connect");
    kept.set_timeout(WAIT);
    let first = kept.get("/", "test").expect("response");
    assert_eq!(first.header("x-backend"), Some("a"));
    let changes = weir.apply_text(&conf("b").toml()).expect("apply");
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].to_string(), "changed route web/all");
    assert_eq!(get(weir.addr, "/").header("x-backend"), Some("b"));
    // A connection idle across the change uses the new route for its next request.
    let next = kept.get("/", "test").expect("response");
    assert_eq!(next.header("x-backend"), Some("b"));
}

#[test]
fn a_request_in_flight_finishes_on_its_snapshot() {
    let slow = Backend::slow(Duration::from_millis(400));
    let fast = Backend::echo("fast");
    let conf = |to: &str| {
        Conf::new()
            .route("all", to, &[])
            .upstream("slow", &[slow.addr()], &[])
            .upstream("fast", &[fast.addr()], &[])
    };
    let weir = conf("slow").start();
    let addr = weir.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/"));
    assert!(wait_until(WAIT, || slow.in_flight() == 1));
    weir.apply_text(&conf("fast").toml()).expect("apply");
    assert_eq!(get(weir.addr, "/").header("x-backend"), Some("fast"));
    let first = in_flight.join().expect("client thread");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-backend"), Some("slow"));
}

#[test]
fn listeners_are_added_and_removed() {
    let backend = Backend::echo("app");
    let base = Conf::new()
        .route("all", "app", &[])
        .upstream("app", &[backend.addr()], &[]);
    let weir = base.start();
    let second = "[[listeners]]\nname = \"second\"\nbind = \"127.0.0.1:0\"\n\
                  [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\n";
    let with_second = format!("{}\n{second}", base.toml());
    let changes = weir.apply_text(&with_second).expect("apply");
    assert_eq!(changes[0].to_string(), "added listener second");
    let addr = weir.proxy().listener_addr("second").expect("bound");
    assert_eq!(get(addr, "/").status, 200);
    // A kept-alive connection on the listener about to go.
    let mut kept = BlockingClient::connect(addr).expect("connect");
    kept.set_timeout(WAIT);
    assert_eq!(kept.get("/", "test").expect("response").status, 200);
    weir.apply_text(&base.toml()).expect("apply");
    assert!(wait_until(WAIT, || std::net::TcpStream::connect(addr).is_err()));
    // Its open connection is answered once more, with `Connection: close`, then closed.
    let last = kept.get("/", "test").expect("response");
    assert_eq!(last.status, 200);
    assert_eq!(last.header("connection"), Some("close"));
    assert!(kept.is_closed_by_peer_within(WAIT));
    // The other listener is untouched.
    assert_eq!(get(weir.addr, "/").status, 200);
}

#[test]
fn metrics_keep_counting_by_name_across_reloads() {
    let backend = Backend::echo("app");
    let routes = |names: &[&str]| {
        let mut conf = Conf::new().upstream("app", &[backend.addr()], &[]);
        for n in names {
            conf = conf.route(n, "app", &[&format!("path_prefix = \"/{n}\"")]);
        }
        conf
    };
    let weir = routes(&["a", "b"]).start();
    let series = "weir_requests_total{listener=\"web\",route=\"b\",method=\"GET\",code=\"200\",protocol=\"HTTP/1.1\"}";
    let c = "weir_requests_total{listener=\"web\",route=\"c\",method=\"GET\",code=\"200\",protocol=\"HTTP/1.1\"}";
    // A request is counted just after its response is sent: poll for the count.
    let counts = |name: &str, n: u64| wait_until(WAIT, || metric(&weir.metrics_text(), name) == n);
    get(weir.addr, "/b");
    assert!(counts(series, 1));
    // Route b moves to another position, a new route takes its old one.
    weir.apply_text(&routes(&["c", "b"]).toml()).expect("apply");
    assert_eq!(metric(&weir.metrics_text(), series), 1);
    get(weir.addr, "/b");
    get(weir.addr, "/c");
    assert!(counts(series, 2), "{}", weir.metrics_text());
    assert!(counts(c, 1));
    assert!(
        !weir.metrics_text().contains("route=\"a\""),
        "a removed route is not exported"
    );
    // Removed and re-added, a route counts on from where it was.
    weir.apply_text(&routes(&["b"]).toml()).expect("apply");
    weir.apply_text(&routes(&["c", "b"]).toml()).expect("apply");
    assert_eq!(metric(&weir.metrics_text(), c), 1);
}

#[test]
fn a_drained_server_takes_no_new_requests() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let conf = |drain: &str| {
        let servers = format!(
            "servers = [{{ addr = \"{}\"{drain} }}, {{ addr = \"{}\" }}]",
            a.addr(),
            b.addr()
        );
        let text = Conf::new().route("all", "app", &[]).toml();
        format!("{text}\n[upstreams.app]\n{servers}\n")
    };
    let weir = Conf::new().start();
    weir.apply_text(&conf(", drain = true")).expect("apply");
    for _ in 0..6 {
        assert_eq!(get(weir.addr, "/").header("x-backend"), Some("b"));
    }
    weir.apply_text(&conf("")).expect("apply");
    let seen: Vec<_> = (0..4)
        .map(|_| get(weir.addr, "/").header("x-backend").map(str::to_string))
        .collect();
    assert!(seen.iter().any(|s| s.as_deref() == Some("a")), "{seen:?}");
}

#[test]
fn unreloadable_changes_are_refused_and_change_nothing() {
    let backend = Backend::echo("app");
    let base = Conf::new()
        .route("all", "app", &[])
        .upstream("app", &[backend.addr()], &[]);
    let weir = base.start();
    let more_workers = base.toml().replace("workers = 1", "workers = 2");
    let err = weir.apply_text(&more_workers).expect_err("refused");
    assert_eq!(err.field(), "server.workers");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = format!(
        "{}\n[[listeners]]\nname = \"busy\"\nbind = \"{}\"\n",
        base.toml(),
        taken.local_addr().expect("addr")
    );
    // SO_REUSEPORT lets weir share a port only with sockets that set it too.
    let err = weir.apply_text(&busy).expect_err("bind fails");
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(weir.proxy().listener_addr("busy").is_none());
    assert_eq!(get(weir.addr, "/").status, 200);
}

#[test]
fn a_listener_switches_between_http_and_tcp() {
    let backend = Backend::echo("app");
    let http = Conf::new()
        .route("all", "app", &[])
        .upstream("app", &[backend.addr()], &[]);
    let tcp = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"app\"")
        .upstream("app", &[backend.addr()], &[]);
    let weir = http.start();
    let forwarded = |addr| {
        let body = get(addr, "/").body_str().to_ascii_lowercase();
        body.contains("x-forwarded-for")
    };
    assert!(forwarded(weir.addr), "HTTP: weir adds forwarded headers");
    weir.apply_text(&tcp.toml()).expect("apply");
    let addr = weir.proxy().listener_addr(common::LISTENER).expect("bound");
    assert!(!forwarded(addr), "TCP: the request head is relayed as sent");
    weir.apply_text(&http.toml()).expect("apply");
    let addr = weir.proxy().listener_addr(common::LISTENER).expect("bound");
    assert!(forwarded(addr));
}
