//! The admin listener in-process, on a real proxy: an API change held between validation
//! and apply (the store's `before_apply` hook) while the probes ask for `/live`, `/ready`
//! and `/metrics` (when changes ran on the admin thread, the probes waited for the apply),
//! and a connection cap changed through the API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use weir_core::Proxy;

use crate::{Admin, AdminState, Store};

const CONFIG: &str =
    "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n\n[admin]\nbind = \"127.0.0.1:0\"\n\n\
                      [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n";

/// One request on a fresh connection (`Connection: close`); the status and the body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/toml\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {text:?}")))?;
    Ok((status, text))
}

#[test]
fn probes_answer_while_a_change_is_applied() {
    let config = weir_config::parse_str(CONFIG, "test").unwrap();
    let proxy = Arc::new(Proxy::start(config, 1).unwrap());
    let store = Arc::new(Store::new(proxy.clone(), None, CONFIG.to_string()));
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    *store.before_apply.lock().unwrap() = Some(Box::new(move || {
        let _ = entered_tx.send(());
        // Bounded, so a failing test cannot hang the apply for ever.
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
    }));
    let state = Arc::new(AdminState {
        ready: AtomicBool::new(true),
        metrics: Some(Box::new(|| "weir_up 1\n".to_string())),
        store: Some(store),
    });
    let admin = Admin::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
    let addr = admin.addr();

    let changed = format!("{CONFIG}\n[upstreams.u]\nservers = [{{ addr = \"127.0.0.1:9\" }}]\n");
    let put = std::thread::spawn(move || request(addr, "PUT", "/api/v1/config", &changed));
    if entered.recv_timeout(Duration::from_secs(10)).is_err() {
        panic!("the change did not reach the apply: {:?}", put.join());
    }
    let during: Vec<_> = ["/live", "/ready", "/metrics"]
        .into_iter()
        .map(|path| (path, request(addr, "GET", path, "")))
        .collect();
    release.send(()).unwrap();
    for (path, answer) in during {
        match answer {
            Ok((status, _)) => assert_eq!(status, 200, "{path} during the apply"),
            Err(e) => panic!("{path} did not answer during the apply: {e}"),
        }
    }
    let (status, text) = put.join().unwrap().expect("the change is answered");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"version\":2"), "{text}");
    assert_eq!(proxy.config().upstreams.len(), 1, "applied");
    admin.stop();
    proxy.shutdown();
}

/// Whether the server closed `s` (read gives EOF or a reset within 5 s).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// A keep-alive connection that was served `GET /live` and is now idle.
fn served_and_kept(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    s
}

/// An admin listener on a real proxy whose `[admin]` section gets `admin_keys` through
/// the API (so the new limits apply to the next connections).
fn capped_admin(admin_keys: &str) -> (Admin, Arc<Store>, Arc<Proxy>) {
    let config = weir_config::parse_str(CONFIG, "test").unwrap();
    let proxy = Arc::new(Proxy::start(config, 1).unwrap());
    let store = Arc::new(Store::new(proxy.clone(), None, CONFIG.to_string()));
    let state = Arc::new(AdminState {
        store: Some(store.clone()),
        ..Default::default()
    });
    let admin = Admin::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
    let capped = CONFIG.replace("[admin]\n", &format!("[admin]\n{admin_keys}\n"));
    let (status, text) = request(admin.addr(), "PUT", "/api/v1/config", &capped).unwrap();
    assert_eq!(status, 200, "{text}");
    (admin, store, proxy)
}

/// `[admin] max_connections` changed through the API applies to the next connections: at
/// the cap, a newcomer takes the place of an idle keep-alive connection, and is refused
/// only while every connection is handling a request.
#[test]
fn a_new_connection_cap_applies_to_the_next_connections() {
    let (admin, store, proxy) = capped_admin("max_connections = 1");
    let addr = admin.addr();
    // One connection, served and kept open...
    let mut first = served_and_kept(addr);
    // ...gives its place to the next one.
    let (status, _) = request(addr, "GET", "/live", "").unwrap();
    assert_eq!(status, 200);
    assert!(
        closed_by_server(&mut first),
        "the idle connection made room"
    );

    // A connection handling a request (an API change held before its apply) keeps it.
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    *store.before_apply.lock().unwrap() = Some(Box::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
    }));
    let changed = CONFIG.replace("[admin]\n", "[admin]\nmax_connections = 2\n");
    let put = std::thread::spawn(move || request(addr, "PUT", "/api/v1/config", &changed));
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut refused = TcpStream::connect(addr).unwrap();
    assert!(closed_by_server(&mut refused), "every slot is busy");
    release.send(()).unwrap();
    let (status, text) = put.join().unwrap().unwrap();
    assert_eq!(status, 200, "{text}");
    let (status, _) = request(addr, "GET", "/live", "").unwrap();
    assert_eq!(status, 200);
    admin.stop();
    proxy.shutdown();
}

/// Clients holding every slot with connections that send nothing cannot keep the probes
/// out: the oldest silent connection is closed for a new one.
#[test]
fn probes_get_through_a_cap_full_of_silent_connections() {
    const CAP: usize = 4;
    let (admin, _store, proxy) = capped_admin(&format!(
        "max_connections = {CAP}\nheader_timeout = \"60s\""
    ));
    let addr = admin.addr();
    let mut silent: Vec<TcpStream> = (0..CAP)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    for probe in ["/live", "/ready", "/live"] {
        let (status, text) = request(addr, "GET", probe, "").unwrap();
        // Not ready: this test's state never says so; what matters is the answer.
        assert!(matches!(status, 200 | 503), "{probe}: {text}");
    }
    assert!(closed_by_server(&mut silent[0]), "the oldest made room");
    // Each probe closed its connection: the next one took the place it left.
    silent.push(TcpStream::connect(addr).unwrap());
    let (status, _) = request(addr, "GET", "/live", "").unwrap();
    assert_eq!(status, 200);
    assert!(closed_by_server(&mut silent[1]), "then the next oldest");
    admin.stop();
    proxy.shutdown();
}

/// Clients holding every slot with connections that were served once and then idle cannot
/// keep a probe out either: a probe that connected last is the freshest connection, so a
/// further newcomer takes the place of an idle one, not the probe's (when silent
/// connections went first, the probe, until its request was in, was the only one, and
/// any newcomer evicted it).
#[test]
fn a_probe_outlasts_idle_connections_older_than_it() {
    const CAP: usize = 2;
    let (admin, _store, proxy) =
        capped_admin(&format!("max_connections = {CAP}\nidle_timeout = \"60s\""));
    let addr = admin.addr();
    let mut idle: Vec<TcpStream> = (0..CAP).map(|_| served_and_kept(addr)).collect();
    // The probe connects (its request not sent yet): the oldest idle one makes room.
    let mut probe = TcpStream::connect(addr).unwrap();
    assert!(
        closed_by_server(&mut idle[0]),
        "the oldest idle one made room"
    );
    // Another newcomer before the probe's request: the other idle one goes, not the probe.
    let _newcomer = TcpStream::connect(addr).unwrap();
    assert!(
        closed_by_server(&mut idle[1]),
        "the next idle one made room"
    );
    probe
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    probe
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = probe.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the probe was served: {answer:?}"
    );
    admin.stop();
    proxy.shutdown();
}
