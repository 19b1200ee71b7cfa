//! Helpers for the upstream integration tests (`upstream_*.rs`): a Weir (client connections
//! never closed for their request count) with one route to
//! upstream `app` whose table the test writes, a switchable backend whose health endpoint
//! can be made to fail, and small client helpers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use weir_core::Proxy;
use weir_testkit::{BlockingClient, Response};

/// How long tests poll for a condition before failing (and a client's read bound): only
/// a hang costs it, so generous for a loaded two-core CI machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// A running Weir (one worker) routing everything to upstream `app`; shut down on drop.
pub struct Weir {
    proxy: Option<Proxy>,
    pub addr: SocketAddr,
}

impl Weir {
    /// Starts Weir with `upstream`: the `[upstreams.app]` table and its sub-tables.
    pub fn start(upstream: &str) -> Weir {
        Weir::start_with("", upstream)
    }

    /// As `start`, with more keys (`listener`, lines) on the listener.
    pub fn start_with(listener: &str, upstream: &str) -> Weir {
        let toml = format!(
            "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nkeepalive_requests = 0\n\
             {listener}\n[[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\n\n{upstream}"
        );
        let config = weir_config::parse_str(&toml, "test.toml")
            .unwrap_or_else(|e| panic!("test config rejected: {e}\n---\n{toml}"));
        let proxy = Proxy::start(config, 1).expect("start weir");
        let addr = proxy.listener_addr("web").expect("listener address");
        Weir {
            proxy: Some(proxy),
            addr,
        }
    }

    pub fn client(&self) -> BlockingClient {
        let mut c = BlockingClient::connect(self.addr).expect("connect to weir");
        c.set_timeout(WAIT);
        c
    }

    /// Whether the active health check currently says server `index` of `app` is up.
    pub fn server_up(&self, index: usize) -> bool {
        let proxy = self.proxy.as_ref().expect("running");
        proxy.snapshot().upstreams[0].servers[index]
            .up
            .load(Ordering::Relaxed)
    }

    /// `weir_upstream_retries_total` of `app`.
    pub fn retries(&self) -> u64 {
        let proxy = self.proxy.as_ref().expect("running");
        let text = (proxy.metrics_renderer())();
        text.lines()
            .find(|l| l.starts_with("weir_upstream_retries_total{") && l.contains("\"app\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown();
        }
    }
}

/// `servers = [...]` with one entry per `(addr, extra keys)`.
pub fn servers(list: &[(SocketAddr, &str)]) -> String {
    let entries: Vec<String> = list
        .iter()
        .map(|(addr, extra)| {
            if extra.is_empty() {
                format!("  {{ addr = \"{addr}\" }},")
            } else {
                format!("  {{ addr = \"{addr}\", {extra} }},")
            }
        })
        .collect();
    format!("servers = [\n{}\n]\n", entries.join("\n"))
}

/// The `X-Backend` header of a response (the name of the echo backend that answered).
pub fn backend_of(r: &Response) -> String {
    r.header("x-backend").unwrap_or("<none>").to_string()
}

/// GET `/` on `client`, expecting 200; returns the backend's name.
#[track_caller]
pub fn get_backend(client: &mut BlockingClient) -> String {
    let r = client.get("/", "app.test").expect("response");
    assert_eq!(r.status, 200, "{}", r.body_str());
    backend_of(&r)
}

/// A backend on a fixed address whose `/healthz` answers 200 or 503 as switched; every
/// other request gets 200 with `X-Backend: <name>`. Plain threads and blocking sockets;
/// stopped on drop.
pub struct Switchable {
    pub addr: SocketAddr,
    healthy: Arc<AtomicBool>,
    health_checks: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Switchable {
    pub fn start(name: &str) -> Switchable {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("address");
        let state = Shared {
            name: name.to_string(),
            healthy: Arc::new(AtomicBool::new(true)),
            health_checks: Arc::new(AtomicUsize::new(0)),
            requests: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let mut s = Switchable {
            addr,
            healthy: state.healthy.clone(),
            health_checks: state.health_checks.clone(),
            requests: state.requests.clone(),
            stop: state.stop.clone(),
            thread: None,
        };
        s.thread = Some(std::thread::spawn(move || accept_loop(listener, state)));
        s
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Health checks received so far.
    pub fn health_checks(&self) -> usize {
        self.health_checks.load(Ordering::SeqCst)
    }

    /// Requests other than health checks received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Switchable {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone)]
struct Shared {
    name: String,
    healthy: Arc<AtomicBool>,
    health_checks: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

fn accept_loop(listener: TcpListener, state: Shared) {
    let mut connections = Vec::new();
    while !state.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let state = state.clone();
                connections.push(std::thread::spawn(move || serve(stream, state)));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    for c in connections {
        let _ = c.join();
    }
}

/// Serves body-less requests on one connection until it closes or the backend stops.
fn serve(mut stream: TcpStream, state: Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !state.stop.load(Ordering::SeqCst) {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            let health = head.starts_with(b"GET /healthz");
            let response = if health {
                // Read the switch before counting: a check counted after a test reads the
                // counter saw the switch as the test left it.
                let healthy = state.healthy.load(Ordering::SeqCst);
                state.health_checks.fetch_add(1, Ordering::SeqCst);
                if healthy {
                    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                        .to_string()
                } else {
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\ndown\n".to_string()
                }
            } else {
                state.requests.fetch_add(1, Ordering::SeqCst);
                format!(
                    "HTTP/1.1 200 OK\r\nX-Backend: {}\r\nContent-Length: 3\r\n\r\nok\n",
                    state.name
                )
            };
            if stream.write_all(response.as_bytes()).is_err() || health {
                return;
            }
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}
