//! The admin listener: `/live`, `/ready`, `/metrics`, and the object API under `/api/v1`
//! (`api`), which changes the running config through the `store`.
//!
//! It runs on its own thread and runtime, separate from the data-plane workers, so it never
//! shares their limits and stays reachable when they are saturated.

#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

pub mod api;
pub mod store;

pub use store::Store;

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
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || serve(listener, state, stopped))?;
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
    listener: std::net::TcpListener,
    state: Arc<AdminState>,
    mut stopped: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return tracing::error!(error = %e, "admin runtime failed"),
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, "admin listener failed"),
        };
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
                _ = stopped.changed() => return,
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| handle(req, state.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<AdminState>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path().starts_with("/api/") {
        return Ok(match &state.store {
            Some(store) => api::handle(req, store).await,
            None => plain(StatusCode::NOT_FOUND, Bytes::from_static(NOT_FOUND), TEXT),
        });
    }
    if let (Some(store), "/metrics") = (&state.store, req.uri().path()) {
        if let Err(e) = api::check_read(store, req.headers()) {
            return Ok(plain(e.status, Bytes::from(e.to_json().to_string()), JSON));
        }
    }
    let (status, body, content_type) = match req.uri().path() {
        "/live" => (StatusCode::OK, Bytes::from_static(b"live\n"), TEXT),
        "/ready" if state.ready.load(Ordering::Acquire) => {
            (StatusCode::OK, Bytes::from_static(b"ready\n"), TEXT)
        }
        "/ready" => (
            StatusCode::SERVICE_UNAVAILABLE,
            Bytes::from_static(b"not ready\n"),
            TEXT,
        ),
        "/metrics" if state.metrics.is_some() => {
            let render = state.metrics.as_ref().map(|m| m()).unwrap_or_default();
            (StatusCode::OK, Bytes::from(render), PROMETHEUS_TEXT)
        }
        _ => (StatusCode::NOT_FOUND, Bytes::from_static(NOT_FOUND), TEXT),
    };
    Ok(plain(status, body, content_type))
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

const NOT_FOUND: &[u8] = b"not found: try /live, /ready, /metrics or /api/v1/config\n";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
