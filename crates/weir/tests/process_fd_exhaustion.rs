//! Seed 002: running out of file descriptors must never end the process. Weir runs with
//! `ulimit -n 64`; 200 client connections exhaust its descriptors; it logs the accept error,
//! keeps serving the connections it has, and serves new ones once descriptors are free.
//! A request that needs an upstream connection meanwhile gets 503, and the server it was
//! for is not ejected: the shortage is Weir's, not the server's.

mod support_process;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support_process::{config, connect, get, get_on, read_response, route_to, Weir};
use weir_testkit::{wait_until, Backend};

const FD_LIMIT: u32 = 64;
const FLOOD: usize = 200;

#[test]
fn fd_exhaustion_is_survived() {
    let backend = Backend::echo("e");
    let other = Backend::echo("o");
    let routes = route_to("e", "/", backend.addr()) + &route_to("o", "/other", other.addr());
    let mut weir = Weir::start_with_fd_limit(
        &config(
            "drain_timeout = \"1s\"",
            // Long timeouts: the flood connections must stay open until the test closes them.
            "header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"\nbacklog = 1024",
            &routes,
        ),
        FD_LIMIT,
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", weir.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert!(
        open_files
            .split_whitespace()
            .any(|w| w == FD_LIMIT.to_string()),
        "{open_files}"
    );

    // A keep-alive client connection (and a pooled upstream connection) before the flood.
    let mut early = connect(weir.addr, Duration::from_secs(2)).unwrap();
    let (head, _) = get_on(&mut early, "/early-1").unwrap();
    assert_eq!(head.status, 200);

    // The flood: connects complete in the kernel backlog whether or not Weir accepts them.
    // Each sends its request at once (a silent connection would wait in the kernel: HTTP
    // listeners defer accepting until the first bytes arrive).
    let started = Instant::now();
    let mut flood: Vec<TcpStream> = Vec::new();
    let mut failed_connects = 0;
    for _ in 0..FLOOD {
        match connect(weir.addr, Duration::from_secs(1)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /flood HTTP/1.1\r\nHost: test\r\n\r\n");
                flood.push(s)
            }
            Err(_) => failed_connects += 1,
        }
    }
    assert!(
        flood.len() > FD_LIMIT as usize,
        "only {} connected",
        flood.len()
    );
    assert!(
        weir.log
            .wait_for("out of resources", Duration::from_secs(20)),
        "the accept error is logged; stderr:\n{}",
        weir.log.text()
    );
    let fds_at_limit = weir.open_fds();
    assert!(!weir.exited(), "alive while out of descriptors");

    // Connections Weir holds are still served: those it accepted answer (the upstream
    // connection may fail for lack of a descriptor: 503, a crash is not); the rest wait in
    // the backlog.
    let mut answered = 0;
    for s in &mut flood[..8] {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if let Ok((head, _)) = read_response(s) {
            assert!(matches!(head.status, 200 | 503), "{}", head.status);
            answered += 1;
        }
    }
    assert!(
        answered > 0,
        "connections accepted before the limit are served"
    );
    // The keep-alive connection from before the flood reuses its pooled upstream connection.
    let (head, _) = get_on(&mut early, "/early-2").expect("the early connection is served");
    assert_eq!(
        head.status, 200,
        "served over the pooled upstream connection"
    );
    // An upstream with no pooled connection needs a descriptor there is none of. Was: 502,
    // and the server ejected for a "connect error" (attacker review): a client holding
    // Weir's descriptors got healthy servers ejected.
    let (head, body) = get_on(&mut early, "/other").expect("the early connection is answered");
    assert_eq!(head.status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("file descriptors"));
    assert!(!weir.exited(), "alive; stderr:\n{}", weir.log.text());

    // Close everything; a fresh request then succeeds.
    drop(flood);
    drop(early);
    let mut last = String::new();
    let recovered = wait_until(Duration::from_secs(30), || match get(weir.addr, "/after") {
        Ok((head, _)) if head.status == 200 => true,
        other => {
            last = format!("{other:?}");
            false
        }
    });
    assert!(recovered, "no 200 after the flood closed: {last}");
    assert!(!weir.exited(), "alive after recovery");
    assert!(
        !weir.log.text().contains("server ejected"),
        "no server ejected for Weir's own shortage:\n{}",
        weir.log.text()
    );
    eprintln!(
        "fd exhaustion: {} connected, {failed_connects} connects failed, {fds_at_limit} fds at \
         the limit, {answered}/8 flood requests answered, flood + recovery took {:?}",
        FLOOD - failed_connects,
        started.elapsed()
    );
}

/// Regression test: clients that connect while Weir is still starting. The listeners used to
/// accept before `weir run` built its signal runtime, so running out of descriptors in that
/// window made building it fail and the process exit 1 ("Too many open files"). Signals are
/// now installed before the listeners bind (run.rs `Signals::install`).
#[test]
fn fd_exhaustion_during_startup_is_survived() {
    let backend = Backend::echo("e");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let text = config(
        "drain_timeout = \"1s\"",
        "header_timeout = \"60s\"\nbacklog = 1024",
        &route_to("e", "/", backend.addr()),
    )
    .replace("127.0.0.1:0", &addr.to_string());
    let dir = support_process::TempDir::new("startup-flood");
    let path = dir.write("weir.toml", &text);

    // Keep connecting from before Weir starts until FLOOD connections are held.
    let flood = std::thread::spawn(move || {
        let mut held = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while held.len() < FLOOD && Instant::now() < deadline {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(s) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        held
    });
    std::thread::sleep(Duration::from_millis(50));
    let mut weir = Weir::spawn_no_wait(support_process::fd_limited(&path, FD_LIMIT));
    let held = flood.join().unwrap();
    assert_eq!(held.len(), FLOOD, "the flood connected");
    assert!(
        weir.log
            .wait_for("out of resources", Duration::from_secs(20)),
        "stderr:\n{}",
        weir.log.text()
    );
    drop(held);
    weir.addr = addr;
    let recovered = wait_until(Duration::from_secs(30), || {
        weir.exited() || matches!(get(addr, "/after"), Ok((h, _)) if h.status == 200)
    });
    assert!(
        recovered && !weir.exited(),
        "weir exited ({:?}); stderr:\n{}",
        weir.wait_exit(Duration::ZERO),
        weir.log.text()
    );
}
