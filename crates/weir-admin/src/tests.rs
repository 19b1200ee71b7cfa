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
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
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

/// `[admin]` limits changed through the API apply to the next connections.
#[test]
fn a_new_connection_cap_applies_to_the_next_connections() {
    let config = weir_config::parse_str(CONFIG, "test").unwrap();
    let proxy = Arc::new(Proxy::start(config, 1).unwrap());
    let store = Arc::new(Store::new(proxy.clone(), None, CONFIG.to_string()));
    let state = Arc::new(AdminState {
        store: Some(store),
        ..Default::default()
    });
    let admin = Admin::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
    let addr = admin.addr();
    let capped = CONFIG.replace("[admin]\n", "[admin]\nmax_connections = 1\n");
    let (status, text) = request(addr, "PUT", "/api/v1/config", &capped).unwrap();
    assert_eq!(status, 200, "{text}");

    // One connection, served and kept open...
    let mut first = TcpStream::connect(addr).unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    first
        .write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 512];
    let n = first.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    // ...so a second is closed at once.
    let mut second = TcpStream::connect(addr).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match second.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the connection over the cap was not closed: {other:?}"),
    }
    drop(first);
    let served = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        matches!(request(addr, "GET", "/live", ""), Ok((200, _)))
    });
    assert!(served, "a connection is served once the first one closed");
    admin.stop();
    proxy.shutdown();
}
