//! The admin listener: `/live`, `/ready`, `/metrics`, the object API under `/api/v1`
//! (`api`), which changes the running config through the `store`, and the dashboard at
//! `/ui/` (`ui`, with its numbers sampled by `stats`).
//!
//! It runs on its own thread and runtime, separate from the data-plane workers, so it never
//! shares their limits and stays reachable when they are saturated. That thread only does
//! quick work: API requests validate, resolve, apply and persist on tokio's blocking pool
//! (`api`), so `/live`, `/ready` and `/metrics` answer while a change is being applied.
//! Connections are capped (`[admin] max_connections`, so idle clients cannot take the
//! process's descriptors; at the cap a newcomer takes the place of the connection idle
//! longest, see `slots`) and timed out (`conn`), and running out of descriptors pauses
//! accepting as on the data plane. Every request but the probes must name this listener
//! in its `Host` and `Origin`, token or not, against DNS rebinding and cross-site pages
//! (`api::guard`).

#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use weir_core::listener::backoff::{is_resource_exhaustion, ResourceLog, RESOURCE_BACKOFF};

pub mod api;
mod config_file;
mod conn;
pub mod shared;
mod slots;
mod stats;
pub mod store;
#[cfg(test)]
mod tests;
mod ui;

use conn::{Clock, Limits};
pub use shared::{Shared, SharedError};
use slots::{Admission, Slot, Slots};
pub use store::Store;

/// The limits when no config is attached (`AdminState::store` is `None`): the `[admin]`
/// defaults.
const DEFAULT_LIMITS: Limits = Limits {
    header_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(60),
    max_connections: 64,
};

/// Threads for API requests (validation and DNS look-ups, apply, file writes, reads that
/// wait for a write in progress). Writes are serialized by the store anyway.
const BLOCKING_THREADS: usize = 4;

/// Renders the Prometheus text exposition.
pub type MetricsRenderer = Box<dyn Fn() -> String + Send + Sync>;

/// What the admin endpoints report on.
#[derive(Default)]
pub struct AdminState {
    /// Config loaded and listeners bound.
    pub ready: AtomicBool,
    /// `/metrics`; 404 when absent.
    pub metrics: Option<MetricsRenderer>,
    /// The object API; 404 when absent.
    pub store: Option<Arc<Store>>,
}

impl AdminState {
    /// The running config's `[admin]` limits (a reload changes them for new connections).
    fn limits(&self) -> Limits {
        self.store
            .as_ref()
            .map_or(DEFAULT_LIMITS, |s| Limits::of(&s.proxy().config().admin))
    }
}

/// A running admin listener; `stop` ends it.
pub struct Admin {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    /// A duplicate of the listening socket, to hand to a new process in a binary upgrade.
    handover: std::net::TcpListener,
}

impl Admin {
    /// Binds `bind` (so returning means it accepts) and serves on a thread of its own.
    pub fn start(bind: SocketAddr, state: Arc<AdminState>) -> io::Result<Admin> {
        Admin::start_on(std::net::TcpListener::bind(bind)?, state)
    }

    /// Serves on an already bound socket (one handed over by a binary upgrade).
    pub fn start_on(listener: std::net::TcpListener, state: Arc<AdminState>) -> io::Result<Admin> {
        listener.set_nonblocking(true)?;
        let handover = listener.try_clone()?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        // Built here, not on the thread: returning means the admin API can serve (a
        // process that runs out of descriptors right after start-up cannot leave it
        // without a runtime, logged as listening).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(BLOCKING_THREADS)
            .build()?;
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || serve(runtime, listener, state, stopped))?;
        Ok(Admin {
            addr,
            stop,
            thread: Some(thread),
            handover,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Another handle on the listening socket (for a binary upgrade).
    pub fn socket(&self) -> io::Result<std::net::TcpListener> {
        self.handover.try_clone()
    }

    pub fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    runtime: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    state: Arc<AdminState>,
    mut stopped: watch::Receiver<bool>,
) {
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, "admin listener failed"),
        };
        if let Some(store) = &state.store {
            tokio::spawn(stats::run(store.clone(), stopped.clone()));
        }
        accept_loop(listener, state, &mut stopped).await;
    });
}

/// Accepts until `stopped`; each connection is served on a task of its own.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    stopped: &mut watch::Receiver<bool>,
) {
    let slots = Arc::new(Slots::default());
    let (mut resource_log, mut cap_log) = (ResourceLog::default(), ResourceLog::default());
    // Requests must name this address (see `api::guard`); the bound one, so port 0 and
    // a socket handed over by an upgrade count as they are.
    let listener_addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => return tracing::error!(error = %e, "admin listener has no address"),
    };
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopped.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_resource_exhaustion(&e) => {
                if let Some(suppressed) = resource_log.should_log() {
                    tracing::warn!(error = %e, suppressed, "admin accept failed: out of resources; pausing accepts");
                }
                tokio::select! {
                    _ = tokio::time::sleep(RESOURCE_BACKOFF) => continue,
                    _ = stopped.changed() => return,
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "admin accept failed");
                continue;
            }
        };
        let limits = state.limits();
        let clock = Clock::new();
        let slot = match slots.admit(&clock, limits.max_connections) {
            Admission::Free(slot) => slot,
            Admission::Evicted(slot) => {
                if let Some(suppressed) = cap_log.should_log() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        suppressed,
                        "admin connection closed for a new one: max_connections reached"
                    );
                }
                slot
            }
            // Closed at once rather than left in the backlog: the client learns straight
            // away, and no descriptor is held for it.
            Admission::Full => {
                if let Some(suppressed) = cap_log.should_log() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        suppressed,
                        "admin connection refused: max_connections reached, all busy"
                    );
                }
                drop(stream);
                continue;
            }
        };
        let state = state.clone();
        let addrs = Addrs {
            peer,
            listener: listener_addr,
        };
        tokio::spawn(serve_connection(
            stream,
            addrs,
            clock,
            Arc::new(slot),
            state,
            limits,
        ));
    }
}

/// Serves one connection until the client closes it, keeps it waiting too long, or its
/// slot goes to a newcomer; the slot is given back when it ends.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    addrs: Addrs,
    clock: Arc<Clock>,
    slot: Arc<Slot>,
    state: Arc<AdminState>,
    limits: Limits,
) {
    let io = TokioIo::new(conn::Watched::new(stream, clock.clone()));
    let service = hyper::service::service_fn(move |req| {
        let (state, slot) = (state.clone(), slot.clone());
        async move {
            if req.uri().path().starts_with("/api/") {
                return Ok(api_request(req, &state, &slot, &limits, addrs).await);
            }
            let _busy = slot.busy();
            handle(req, state, addrs).await
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        // `conn` keeps the time instead (hyper's would also cut idle keep-alive waits).
        .header_read_timeout(None)
        .serve_connection(io, service);
    conn::serve(connection, &clock, &limits).await;
}

/// Both ends of an admin connection: the client, and the listener's bound address.
#[derive(Debug, Clone, Copy)]
struct Addrs {
    peer: SocketAddr,
    listener: SocketAddr,
}

/// An `/api/` request. The connection counts as handling it (held, not evictable) only
/// once its body has arrived, and only within the API's share of the connections
/// ([`slots::api_share`]): a body must arrive within `header_timeout` (408) and its
/// connection can be evicted meanwhile, and the probes always find a connection to take
/// the place of.
async fn api_request(
    req: Request<Incoming>,
    state: &AdminState,
    slot: &Arc<Slot>,
    limits: &Limits,
    addrs: Addrs,
) -> Response<Full<Bytes>> {
    if let Err(e) = guard(state, addrs.listener, &req) {
        drop(slot.busy());
        return refused(e);
    }
    let response = match &state.store {
        Some(store) => {
            let share = slots::api_share(limits.max_connections);
            slot.reading_body();
            let busy = || slot.busy_api(share);
            api::handle(req, store.clone(), addrs.peer, limits.header_timeout, busy).await
        }
        None => plain(StatusCode::NOT_FOUND, Bytes::from_static(NOT_FOUND), TEXT),
    };
    // The request is over: the connection waits for the next one (idle_timeout) and is
    // the freshest.
    drop(slot.busy());
    response
}

fn refused(e: api::error::ApiError) -> Response<Full<Bytes>> {
    plain(e.status, Bytes::from(format!("{}\n", e.to_json())), JSON)
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<AdminState>,
    addrs: Addrs,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    // The probes answer any Host (see `api::guard`); everything else must name this
    // listener, even with a token.
    if !matches!(path, "/live" | "/ready") {
        if let Err(e) = guard(&state, addrs.listener, &req) {
            return Ok(refused(e));
        }
    }
    if path == "/ui" || path.starts_with("/ui/") {
        // The page holds no data: it is served without the token (see `ui`).
        let on = state
            .store
            .as_ref()
            .is_some_and(|s| s.proxy().config().admin.dashboard.is_some());
        return Ok(ui::serve(req.method(), path, on));
    }
    if let (Some(store), "/metrics") = (&state.store, req.uri().path()) {
        if let Err(e) = api::check_read(store, req.headers()).await {
            return Ok(plain(e.status, Bytes::from(e.to_json().to_string()), JSON));
        }
    }
    let (status, body, content_type) = match req.uri().path() {
        "/live" => (StatusCode::OK, Bytes::from_static(b"live\n"), TEXT),
        "/ready" => {
            let (status, body) = readiness(&state);
            (status, body, TEXT)
        }
        "/metrics" if state.metrics.is_some() => {
            let render = state.metrics.as_ref().map(|m| m()).unwrap_or_default();
            (StatusCode::OK, Bytes::from(render), PROMETHEUS_TEXT)
        }
        _ => (StatusCode::NOT_FOUND, Bytes::from_static(NOT_FOUND), TEXT),
    };
    Ok(plain(status, body, content_type))
}

/// The DNS-rebinding and cross-site checks of `api::guard`, against the running config's
/// `[admin] allowed_hosts`.
fn guard(
    state: &AdminState,
    listener: SocketAddr,
    req: &Request<Incoming>,
) -> Result<(), api::error::ApiError> {
    let config = state.store.as_ref().map(|s| s.proxy().config());
    let allowed = config
        .as_ref()
        .map_or(&[][..], |c| &c.admin.allowed_hosts[..]);
    api::guard::check(listener, allowed, req.headers(), req.uri(), req.method())
}

/// `/ready`: ready once the config is loaded and the listeners bound; a fleet member also
/// needs shared objects, and says how in sync it is on a second line.
fn readiness(state: &AdminState) -> (StatusCode, Bytes) {
    let ready = state.ready.load(Ordering::Acquire);
    let shared = state.store.as_ref().and_then(|s| s.shared());
    let (ready, detail) = match shared.map(|s| s.readiness()) {
        Some((fleet_ready, line)) => (ready && fleet_ready, format!("cluster: {line}\n")),
        None => (ready, String::new()),
    };
    let (status, word) = match ready {
        true => (StatusCode::OK, "ready"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
    };
    (status, Bytes::from(format!("{word}\n{detail}")))
}

fn plain(status: StatusCode, body: Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

const NOT_FOUND: &[u8] = b"not found: try /live, /ready, /metrics, /api/v1/config or /ui/\n";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
