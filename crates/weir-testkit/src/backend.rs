//! The [`Backend`] handle: a test HTTP/1.1 server on its own thread.
//!
//! Every backend binds `127.0.0.1:0` synchronously (so [`Backend::addr`] is
//! connectable as soon as the constructor returns), then runs a
//! current-thread tokio runtime on a dedicated OS thread. It therefore works
//! the same from a plain `#[test]`, from `#[tokio::test]` and from a binary
//! such as `weir demo`. Each accepted connection is served by its own task:
//! request heads are parsed with httparse, request bodies framed by
//! Content-Length or chunked coding are read, and connections are kept alive
//! per HTTP/1.1 rules (`Connection: close` and HTTP/1.0 are honoured).
//!
//! Dropping the handle signals the accept loop to stop, joins the thread and
//! drops the runtime, which cancels every connection task and closes its
//! socket; it does not wait for clients, so it cannot hang.
//!
//! A misbehaving client never panics a backend: any parse or I/O error just
//! drops that connection.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use tokio_rustls::TlsAcceptor;

use crate::behaviours::{self, After, Behaviour};
use crate::tls_backend;
use crate::wire::{self, Conn, MAX_HEADERS, MAX_REQUEST_HEAD};

/// Counters shared between a backend's thread and its handle.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    accepted: AtomicUsize,
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    /// TLS backends: the server name of each completed handshake ("" without SNI).
    pub(crate) sni: std::sync::Mutex<Vec<String>>,
    /// TLS backends: handshakes that failed (bad client certificate, no shared version...).
    pub(crate) tls_failures: AtomicUsize,
    /// TLS backends: handshakes that resumed an earlier session (abbreviated).
    pub(crate) tls_resumed: AtomicUsize,
}

/// A running test backend; stops when dropped. Each constructor
/// ([`echo`](Backend::echo), [`fixed`](Backend::fixed), ...) documents what
/// that kind answers.
pub struct Backend {
    addr: SocketAddr,
    stats: Arc<Stats>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("addr", &self.addr)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Connections a backend's listener queues before the kernel drops SYNs: an attack test
/// opens thousands of upstream connections at once, and the default of 128 made their
/// connects wait seconds on SYN retries (the kernel caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 4096;

/// A listener bound to `addr` with a [`BACKLOG`] queue.
fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

impl Backend {
    /// Starts a backend with the given behaviour. Panics only if the
    /// loopback listener or the runtime cannot be created.
    pub(crate) fn spawn(behaviour: Behaviour) -> Backend {
        Backend::spawn_with(behaviour, None)
    }

    /// [`Backend::spawn`], speaking TLS with `tls` first when given.
    pub(crate) fn spawn_with(behaviour: Behaviour, tls: Option<TlsAcceptor>) -> Backend {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = listen(loopback).expect("testkit: bind 127.0.0.1:0");
        Backend::spawn_on(listener, behaviour, tls)
    }

    /// An [`echo`](Backend::echo) backend named `name` answering after `delay`, bound to
    /// `addr` (another loopback address such as `127.0.0.2`, with a chosen port, as DNS
    /// answers name several hosts on one port). Fails where the address is taken.
    pub fn echo_at(name: &str, addr: SocketAddr, delay: Duration) -> io::Result<Backend> {
        let listener = listen(addr)?;
        let behaviour = Behaviour::Echo {
            name: name.to_string(),
            delay,
            close_each: false,
            close_after: None,
        };
        Ok(Backend::spawn_on(listener, behaviour, None))
    }

    fn spawn_on(
        listener: std::net::TcpListener,
        behaviour: Behaviour,
        tls: Option<TlsAcceptor>,
    ) -> Backend {
        listener
            .set_nonblocking(true)
            .expect("testkit: set listener non-blocking");
        let addr = listener.local_addr().expect("testkit: listener address");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("testkit: build backend runtime");
        let stats = Arc::new(Stats::default());
        let (tx, rx) = oneshot::channel();
        let thread_stats = Arc::clone(&stats);
        let thread = thread::Builder::new()
            .name(format!("testkit-backend-{}", addr.port()))
            .spawn(move || {
                let serve = Serve {
                    behaviour: Arc::new(behaviour),
                    stats: thread_stats,
                    tls,
                };
                runtime.block_on(accept_loop(listener, Arc::new(serve), rx));
                // Dropping the runtime here cancels all connection tasks.
                drop(runtime);
            })
            .expect("testkit: spawn backend thread");
        Backend {
            addr,
            stats,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// The address the backend listens on (`127.0.0.1:<ephemeral port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// TCP connections accepted so far. Counted when the accept loop picks the
    /// connection up, which may be slightly after the peer's `connect`
    /// returns: poll with [`wait_until`](crate::wait_until) if you need it
    /// before any response has been received.
    pub fn connections_accepted(&self) -> usize {
        self.stats.accepted.load(Ordering::SeqCst)
    }

    /// Requests received: counted as soon as a request head has been parsed,
    /// so it includes requests that `reset`, `hang` or `close_mid_body`
    /// backends never answer properly. When a client has a response in hand,
    /// its request is already counted.
    pub fn requests_served(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    /// Requests whose head has been read but whose handling (reading the
    /// body, waiting, writing the response) has not finished yet. A request
    /// leaves it just after its response was written: poll for 0 with
    /// [`wait_until`](crate::wait_until) once a client has its response.
    pub fn in_flight(&self) -> usize {
        self.stats.in_flight.load(Ordering::SeqCst)
    }

    /// TLS backends: the server name (SNI) of each completed handshake, in order; an
    /// empty string for a client that sent none.
    pub fn sni_seen(&self) -> Vec<String> {
        self.stats.sni.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// TLS backends: handshakes that failed.
    pub fn tls_failures(&self) -> usize {
        self.stats.tls_failures.load(Ordering::SeqCst)
    }

    /// TLS backends: handshakes that resumed an earlier session.
    pub fn tls_resumed(&self) -> usize {
        self.stats.tls_resumed.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the backend thread is not re-raised from drop.
            let _ = thread.join();
        }
    }
}

/// What the accept loop hands each connection.
struct Serve {
    behaviour: Arc<Behaviour>,
    stats: Arc<Stats>,
    tls: Option<TlsAcceptor>,
}

async fn accept_loop(
    listener: std::net::TcpListener,
    serve: Arc<Serve>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        tokio::select! {
            // Resolves on an explicit signal or when the handle is dropped.
            _ = &mut shutdown => return,
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    serve.stats.accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(start_connection(stream, Arc::clone(&serve)));
                }
                // E.g. EMFILE: back off briefly instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
}

/// Decrements `in_flight` when a request's handling ends, however it ends.
struct InFlight<'a>(&'a Stats);

impl<'a> InFlight<'a> {
    fn enter(stats: &'a Stats) -> InFlight<'a> {
        stats.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs the TLS handshake (TLS backends), then serves HTTP on the connection.
async fn start_connection(stream: TcpStream, serve: Arc<Serve>) {
    let conn = match &serve.tls {
        None => Conn::new(stream),
        Some(acceptor) => match tls_backend::accept(acceptor, stream, &serve.stats).await {
            Some(conn) => conn,
            None => return,
        },
    };
    serve_connection(conn, Arc::clone(&serve.behaviour), Arc::clone(&serve.stats)).await;
}

async fn serve_connection(mut conn: Conn, behaviour: Arc<Behaviour>, stats: Arc<Stats>) {
    let mut served = 0usize;
    loop {
        let req = match read_request_head(&mut conn).await {
            Ok(Some(req)) => req,
            // Clean EOF between requests, or a bad/aborted request: drop.
            Ok(None) | Err(_) => return,
        };
        let after = {
            // In flight before counted: a test that saw `requests_served() == n` of
            // hanging requests then sees them all in `in_flight()`.
            let _guard = InFlight::enter(&stats);
            stats.requests.fetch_add(1, Ordering::SeqCst);
            behaviours::handle(&mut conn, &req, &behaviour, served).await
        };
        match after {
            Ok(After::KeepAlive) => served += 1,
            Ok(After::Close) => {
                close_gracefully(conn).await;
                return;
            }
            Ok(After::Abort) | Err(_) => return,
        }
    }
}

/// Sends FIN, then discards whatever the peer still sends (for at most one
/// second) so that unread input does not turn the close into a RST that could
/// destroy the response in flight.
async fn close_gracefully(mut conn: Conn) {
    let _ = conn.stream.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            conn.buf.clear();
            match conn.fill().await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// A parsed request head.
#[derive(Debug, Clone)]
pub(crate) struct RequestHead {
    pub(crate) method: String,
    /// Minor HTTP version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub(crate) version: u8,
    pub(crate) headers: Vec<(String, String)>,
    /// The head exactly as received, up to and including the empty line.
    pub(crate) raw: Vec<u8>,
}

impl RequestHead {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    pub(crate) fn has_token(&self, name: &str, token: &str) -> bool {
        wire::has_token(&self.headers, name, token)
    }

    /// Whether the client allows the connection to stay open afterwards.
    pub(crate) fn keep_alive(&self) -> bool {
        if self.version >= 1 {
            !self.has_token("connection", "close")
        } else {
            self.has_token("connection", "keep-alive")
        }
    }
}

/// Reads the next request head. `Ok(None)` on EOF before any byte of it.
async fn read_request_head(conn: &mut Conn) -> io::Result<Option<RequestHead>> {
    loop {
        if !conn.buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&conn.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let head = RequestHead {
                        method: req.method.unwrap_or_default().to_string(),
                        version: req.version.unwrap_or(1),
                        headers: wire::owned_headers(req.headers),
                        raw: conn.buf[..n].to_vec(),
                    };
                    conn.buf.drain(..n);
                    return Ok(Some(head));
                }
                Ok(httparse::Status::Partial) => {
                    if conn.buf.len() > MAX_REQUEST_HEAD {
                        return Err(wire::invalid("request head too large"));
                    }
                }
                Err(_) => return Err(wire::invalid("malformed request head")),
            }
        }
        if conn.fill().await? == 0 {
            return if conn.buf.is_empty() {
                Ok(None)
            } else {
                Err(wire::eof("connection closed inside a request head"))
            };
        }
    }
}
