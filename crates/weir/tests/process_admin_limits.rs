//! Issue 17, item 3: the admin listener under idle and descriptor-hungry clients, through
//! the real binary. Idle admin connections are closed after `[admin] header_timeout` /
//! `header_timeout` (an API body that stops short gets 408, and its connection can be
//! evicted for a probe meanwhile); with `ulimit -n 64`, connections over `[admin] max_connections` are
//! closed at once so the data plane keeps its descriptors; and when the process is out of
//! descriptors anyway, the admin accept loop pauses instead of spinning on EMFILE.

mod support_process;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support_process::{config, connect, get, get_on, read_response, route_to, Weir, START_WAIT};
use weir_testkit::{wait_until, Backend};

const FD_LIMIT: u32 = 64;

/// A config with the admin listener on `127.0.0.1:0` with `admin_keys`, and listener `web`
/// with `listener_keys` routing everything to `backend`.
fn text(admin_keys: &str, listener_keys: &str, backend: SocketAddr) -> String {
    config(
        "drain_timeout = \"1s\"",
        listener_keys,
        &route_to("e", "/", backend),
    )
    .replace(
        "[admin]\nbind = \"off\"",
        &format!("[admin]\nbind = \"127.0.0.1:0\"\n{admin_keys}"),
    )
}

/// Whether the server has closed `s` (EOF or reset), without waiting.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    let closed = match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).expect("blocking");
    closed
}

/// Waits (bounded) until the server closes `s`: the blocking read returns at the close.
fn wait_closed(s: &mut TcpStream, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    s.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(started.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(started.elapsed()),
            Err(e) => return Err(format!("still open after {:?}: {e}", started.elapsed())),
        }
    }
}

/// The process's CPU time (user + system) from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 1..];
    let fields: Vec<u64> = after_comm
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime: fields 14 and 15 overall, 11 and 12 after the comm.
    let ticks = fields[11] + fields[12];
    // SAFETY: sysconf takes a plain integer and touches no memory.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

#[test]
fn idle_admin_connections_are_closed_after_the_timeouts() {
    let backend = Backend::echo("e");
    let weir = Weir::start(&text(
        "header_timeout = \"1s\"\nidle_timeout = \"2s\"",
        "",
        backend.addr(),
    ));
    let admin = weir.admin_addr();
    let limit = Duration::from_secs(15);

    // Silent since the connect: header_timeout.
    let mut silent: Vec<TcpStream> = (0..4)
        .map(|_| connect(admin, Duration::from_secs(2)).expect("connect"))
        .collect();
    // Half a request head, then nothing: header_timeout.
    let mut partial = connect(admin, Duration::from_secs(2)).expect("connect");
    partial.write_all(b"GET /live HTTP/1.1\r\nHost: a").unwrap();
    // One request answered, then idle on keep-alive: idle_timeout.
    let mut kept = connect(admin, Duration::from_secs(2)).expect("connect");
    let (head, body) = get_on(&mut kept, "/live").expect("/live");
    assert_eq!((head.status, body.as_slice()), (200, &b"live\n"[..]));

    // An API request whose body stops short: 408 after header_timeout.
    let mut short = connect(admin, Duration::from_secs(2)).expect("connect");
    let head = format!(
        "PUT /api/v1/config HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/toml\r\n\
         Content-Length: 100\r\n\r\n[server]"
    );
    short.write_all(head.as_bytes()).unwrap();

    for (i, s) in silent.iter_mut().enumerate() {
        wait_closed(s, limit).unwrap_or_else(|e| panic!("silent connection {i}: {e}"));
    }
    wait_closed(&mut partial, limit).unwrap_or_else(|e| panic!("partial head: {e}"));
    wait_closed(&mut kept, limit).unwrap_or_else(|e| panic!("idle keep-alive: {e}"));
    short.set_read_timeout(Some(limit)).unwrap();
    let (head, body) = read_response(&mut short).expect("an answer to the short body");
    assert_eq!(head.status, 408, "{}", String::from_utf8_lossy(&body));
    wait_closed(&mut short, limit).unwrap_or_else(|e| panic!("after the 408: {e}"));
    // Closed, not broken: a new connection is served.
    let (head, _) = get(admin, "/live").expect("/live after the timeouts");
    assert_eq!(head.status, 200);
}

#[test]
fn idle_admin_connections_do_not_starve_the_data_plane() {
    const CAP: usize = 8;
    const IDLE: usize = 100;
    let backend = Backend::echo("e");
    let weir = Weir::start_with_fd_limit(
        &text(
            // Long timeouts: the idle connections are held until the test drops them.
            &format!("header_timeout = \"60s\"\nidle_timeout = \"60s\"\nmax_connections = {CAP}"),
            "",
            backend.addr(),
        ),
        FD_LIMIT,
    );
    let admin = weir.admin_addr();

    // More idle admin connections than the process has descriptors.
    let mut idle: Vec<TcpStream> = (0..IDLE)
        .filter_map(|_| connect(admin, Duration::from_secs(1)).ok())
        .collect();
    assert!(
        idle.len() > FD_LIMIT as usize,
        "only {} connected",
        idle.len()
    );
    // All but CAP of them are closed by Weir, straight away.
    let mut open = idle.len();
    let capped = wait_until(Duration::from_secs(20), || {
        open = idle.iter_mut().map(closed_by_server).filter(|c| !c).count();
        open <= CAP
    });
    assert!(
        capped,
        "{open} of {} idle admin connections still open (max_connections = {CAP}); stderr:\n{}",
        idle.len(),
        weir.log.text()
    );
    // Weir logs before it closes, but stderr reaches the log through a reader thread.
    let logged = weir.log.wait_for("max_connections reached", START_WAIT);
    assert!(logged, "{}", weir.log.text());

    // The data plane has the descriptors it needs while they are held.
    for i in 0..20 {
        let (head, body) = get(weir.addr, &format!("/data-{i}"))
            .unwrap_or_else(|e| panic!("data-plane request {i}: {e}"));
        assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&body));
    }
    drop(idle);
    let reachable = wait_until(
        Duration::from_secs(20),
        || matches!(get(admin, "/live"), Ok((h, _)) if h.status == 200),
    );
    assert!(reachable, "admin serves again once the idle clients leave");
}

#[test]
fn admin_accept_backs_off_when_out_of_descriptors() {
    const FLOOD: usize = 200;
    let backend = Backend::echo("e");
    let mut weir = Weir::start_with_fd_limit(
        &text(
            "header_timeout = \"60s\"\nidle_timeout = \"60s\"",
            "header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"\nbacklog = 1024",
            backend.addr(),
        ),
        FD_LIMIT,
    );
    let admin = weir.admin_addr();

    // Data-plane clients take every descriptor (as in process_fd_exhaustion.rs)...
    let mut flood: Vec<TcpStream> = Vec::new();
    for _ in 0..FLOOD {
        if let Ok(mut s) = connect(weir.addr, Duration::from_secs(1)) {
            let _ = s.write_all(b"GET /flood HTTP/1.1\r\nHost: test\r\n\r\n");
            flood.push(s);
        }
    }
    assert!(
        weir.log
            .wait_for("out of resources", Duration::from_secs(20)),
        "the data plane runs out of descriptors; stderr:\n{}",
        weir.log.text()
    );
    // ...so the admin listener's accept fails with EMFILE for these.
    let waiting: Vec<TcpStream> = (0..4)
        .filter_map(|_| connect(admin, Duration::from_secs(1)).ok())
        .collect();
    assert!(!waiting.is_empty(), "admin connections wait in the backlog");
    assert!(
        weir.log.wait_for(
            "admin accept failed: out of resources",
            Duration::from_secs(20)
        ),
        "stderr:\n{}",
        weir.log.text()
    );

    // While it stays out of descriptors, the process is close to idle: no accept loop
    // spins. Spinning took most of a core; a pause per failed accept takes a few percent.
    let window = Duration::from_secs(3);
    let before = cpu_time(weir.pid());
    std::thread::sleep(window);
    let used = cpu_time(weir.pid()) - before;
    eprintln!("CPU while out of descriptors: {used:?} in {window:?}");
    assert!(
        used < window.mul_f64(0.3),
        "{used:?} of CPU in {window:?} while out of descriptors"
    );
    let logged = weir
        .log
        .wait_for("admin accept failed: out of resources", START_WAIT);
    assert!(logged, "{}", weir.log.text());
    assert!(!weir.exited(), "alive; stderr:\n{}", weir.log.text());

    // Descriptors back: the waiting admin connections and new ones are served.
    drop(flood);
    let mut waiting = waiting;
    let (head, _) = get_on(&mut waiting[0], "/live").expect("a waiting admin connection");
    assert_eq!(head.status, 200);
    let reachable = wait_until(
        Duration::from_secs(20),
        || matches!(get(admin, "/live"), Ok((h, _)) if h.status == 200),
    );
    assert!(reachable, "admin serves new connections again");
}

/// Attack report F4: API requests whose bodies trickle (no token needed on a loopback
/// bind) used to count as busy and fill `max_connections`, so `/live` and `/ready` were
/// refused. A body being read leaves its connection evictable: the probes get in.
#[test]
fn api_bodies_that_trickle_do_not_lock_out_the_probes() {
    const CAP: usize = 4;
    let backend = Backend::echo("e");
    let weir = Weir::start(&text(
        &format!("max_connections = {CAP}\nheader_timeout = \"60s\""),
        "",
        backend.addr(),
    ));
    let admin = weir.admin_addr();
    let mut stalled: Vec<TcpStream> = (0..CAP)
        .map(|_| {
            let mut s = connect(admin, Duration::from_secs(2)).expect("connect");
            let head = format!(
                "PUT /api/v1/config HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/toml\r\n\
                 Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n"
            );
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    // hyper says 100 Continue when the handler starts reading the body: each connection is
    // in its body now (a handler that counted as busy from its head on would hold it).
    for (i, s) in stalled.iter_mut().enumerate() {
        s.set_read_timeout(Some(START_WAIT)).unwrap();
        let head = support_process::read_head(s)
            .unwrap_or_else(|e| panic!("stalled {i}: no 100 Continue: {e}"));
        assert_eq!(head.status, 100, "stalled {i}");
        s.write_all(b"[server]\n").unwrap();
    }
    for probe in ["/live", "/ready", "/live"] {
        let (head, body) = get(admin, probe).unwrap_or_else(|e| panic!("{probe}: {e}"));
        assert_eq!(
            head.status,
            200,
            "{probe}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}
