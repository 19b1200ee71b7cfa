//! The per-worker pool of HTTP/2 connections to upstream servers (`protocol = "h2"`,
//! `"h2c"`, `"auto"`), built on the `h2` crate's client.
//!
//! A connection carries many requests at once: a request takes a [`Lease`] on the first
//! connection of its server with a free stream (fewer in flight than the upstream's
//! `max_concurrent_streams` and the server's own SETTINGS limit), and a new connection is
//! opened when every one is full. Each connection's frames are driven by a local task;
//! when it ends (the server closed, an I/O or protocol error) the connection is marked
//! closed and dropped from the pool at the next checkout. A connection whose server sent
//! GOAWAY refuses new streams (`send_request` fails): the lease holder marks it going
//! away, and the request goes to a new connection. Idle connections (no stream in flight)
//! older than `idle_timeout` are closed at checkout, or within 10 s by the worker's sweep.
//!
//! Only the worker's own thread touches the pool (`RefCell` on the worker, never borrowed
//! across an await), so no lock is taken.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::SendStream;
use tokio::sync::Notify;
use weir_config::{Upstream, UpstreamProtocol, UpstreamServer};

use super::{connect, handshake_failed, PoolKey, TlsUpstream, UpstreamStream};
use crate::error::ProxyError;

/// The stream window Weir offers each upstream stream, and the connection's window:
/// large enough that one response is not paced by round trips on a LAN.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 4 << 20;

/// What a checkout found.
pub enum Checkout {
    /// A stream may be opened on this connection.
    Lease(Lease),
    /// `protocol = "auto"` and the server chose HTTP/1.1 over ALPN: use the HTTP/1.1
    /// exchange for it (remembered for the life of the worker's pool).
    Http1,
}

/// One HTTP/2 connection to a server.
pub struct H2Conn {
    send: SendRequest<Bytes>,
    /// Set by the driver task when the connection ended.
    closed: Rc<Cell<bool>>,
    /// The server sent GOAWAY (or a stream could not be opened): no new streams.
    going_away: Cell<bool>,
    in_flight: Cell<usize>,
    /// When the last stream ended (for `idle_timeout`).
    idle_since: Cell<Instant>,
    /// The upstream's `idle_timeout` when the connection was opened.
    idle_timeout: Duration,
}

impl H2Conn {
    fn usable(&self) -> bool {
        !self.closed.get() && !self.going_away.get()
    }

    /// Worth keeping in the pool at `now`: usable, and not idle for its `idle_timeout`.
    fn keep(&self, now: Instant) -> bool {
        // Every checkout asks this of each of the server's connections: the idle time
        // only of an idle one.
        let idle = || self.in_flight.get() == 0;
        let expired = || now.saturating_duration_since(self.idle_since.get()) >= self.idle_timeout;
        self.usable() && !(idle() && expired())
    }

    fn has_room(&self, limit: usize) -> bool {
        // The server's SETTINGS_MAX_CONCURRENT_STREAMS bounds ours.
        let server = self.send.current_max_send_streams();
        self.usable() && self.in_flight.get() < limit.min(server)
    }
}

/// A stream's claim on a connection: released (and the connection's idle time started)
/// when dropped.
pub struct Lease {
    conn: Rc<H2Conn>,
}

impl Lease {
    fn new(conn: Rc<H2Conn>) -> Lease {
        conn.in_flight.set(conn.in_flight.get() + 1);
        Lease { conn }
    }

    /// Opens a stream for `request` (ending it at once when `end`). An error means the
    /// connection takes no new streams (GOAWAY, closed): the request was not sent, and the
    /// connection is not offered again.
    pub async fn send_request(
        &self,
        request: http::Request<()>,
        end: bool,
    ) -> Result<(ResponseFuture, SendStream<Bytes>), h2::Error> {
        let result = async {
            let mut send = self.conn.send.clone().ready().await?;
            send.send_request(request, end)
        }
        .await;
        if result.is_err() {
            self.conn.going_away.set(true);
        }
        result
    }

    /// Marks the connection as taking no new streams (its server said GOAWAY).
    pub fn drain(&self) {
        self.conn.going_away.set(true);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let n = self.conn.in_flight.get().saturating_sub(1);
        self.conn.in_flight.set(n);
        if n == 0 {
            self.conn.idle_since.set(Instant::now());
        }
    }
}

/// The worker's HTTP/2 connections, per server address and TLS client.
#[derive(Default)]
pub struct H2Pool {
    conns: HashMap<PoolKey, Vec<Rc<H2Conn>>>,
    /// `auto` servers that chose HTTP/1.1.
    http1: HashMap<PoolKey, ()>,
    /// Connections being opened: requests that find no room wait for them rather than
    /// each opening its own (a burst at start would otherwise open one per request).
    connecting: HashMap<PoolKey, Rc<Notify>>,
}

impl H2Pool {
    /// A connection of `key` with a free stream, after dropping closed, going-away and
    /// expired idle ones. `None`: every connection is full (or there is none).
    fn find(&mut self, key: PoolKey, limit: usize, now: Instant) -> Option<Rc<H2Conn>> {
        let list = self.conns.get_mut(&key)?;
        // Leases keep a dropped connection alive until their streams end.
        list.retain(|c| c.keep(now));
        list.iter().find(|c| c.has_room(limit)).cloned()
    }

    /// Drops the closed, going-away and expired idle connections of every server, and
    /// the servers left with none: connections of servers or TLS clients a reload (or
    /// DNS) removed are found by no `find` and would otherwise stay open. On each new
    /// connection (a rare event, so cheap enough), and every 10 s (`server`'s trim).
    pub fn sweep(&mut self, now: Instant) {
        self.conns.retain(|_, list| {
            list.retain(|c| c.keep(now));
            !list.is_empty()
        });
    }

    /// Adds a new connection, after a [`H2Pool::sweep`].
    fn add(&mut self, key: PoolKey, send: SendRequest<Bytes>, opened: Opened) -> Rc<H2Conn> {
        let now = Instant::now();
        self.sweep(now);
        let conn = Rc::new(H2Conn {
            send,
            closed: opened.closed,
            going_away: Cell::new(false),
            in_flight: Cell::new(0),
            idle_since: Cell::new(now),
            idle_timeout: opened.idle_timeout,
        });
        self.conns.entry(key).or_default().push(conn.clone());
        conn
    }
}

/// What a new connection's entry starts from.
struct Opened {
    /// Set by the driver task when the connection ends.
    closed: Rc<Cell<bool>>,
    idle_timeout: Duration,
}

/// Ends a pool's `connecting` mark for a key and wakes who waited on it, however the
/// connect ends (done, failed, cancelled).
struct Connecting<'a> {
    pool: &'a RefCell<H2Pool>,
    key: PoolKey,
}

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.pool.try_borrow_mut() {
            if let Some(n) = pool.connecting.remove(&self.key) {
                n.notify_waiters();
            }
        }
    }
}

/// A stream on a connection to `server`: a pooled connection with room, else a new one
/// (TCP, TLS with ALPN for `h2`/`auto`, then the HTTP/2 handshake, all within
/// `connect_timeout`). `now`: a time the request path already read (pooled connections
/// idle past their `idle_timeout` are dropped as of it).
pub async fn checkout(
    pool: &RefCell<H2Pool>,
    upstream: &Upstream,
    server: &UpstreamServer,
    tls: Option<&TlsUpstream>,
    mut now: Instant,
) -> Result<Checkout, ProxyError> {
    let key = PoolKey::new(server, tls);
    let limit = upstream.max_concurrent_streams as usize;
    loop {
        let wait = {
            let mut p = pool.borrow_mut();
            // Usually empty (only `auto` servers that chose HTTP/1.1): no lookup then.
            if !p.http1.is_empty() && p.http1.contains_key(&key) {
                return Ok(Checkout::Http1);
            }
            if let Some(conn) = p.find(key, limit, now) {
                return Ok(Checkout::Lease(Lease::new(conn)));
            }
            match p.connecting.get(&key) {
                Some(n) => n.clone(),
                None => {
                    p.connecting.insert(key, Rc::new(Notify::new()));
                    break;
                }
            }
        };
        wait.notified().await;
        // The wait may have lasted up to `connect_timeout`: idle times as of now.
        now = Instant::now();
    }
    let _connecting = Connecting { pool, key };
    let io = match open(upstream, server, tls).await? {
        Some(io) => io,
        None => {
            pool.borrow_mut().http1.insert(key, ());
            return Ok(Checkout::Http1);
        }
    };
    let deadline = tokio::time::Instant::now() + upstream.connect_timeout;
    let handshake = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_max_send_streams(limit)
        // h2's own default is 16 MiB: a server's head, 1xx or trailers would be held whole.
        .max_header_list_size(upstream.max_header_list_size)
        .enable_push(false)
        .handshake::<_, Bytes>(io);
    let (send, connection) = match tokio::time::timeout_at(deadline, handshake).await {
        Err(_) => return Err(ProxyError::UpstreamConnectTimeout),
        Ok(Err(e)) => return Err(h2_error(&e)),
        Ok(Ok(pair)) => pair,
    };
    let closed = Rc::new(Cell::new(false));
    let flag = closed.clone();
    let name = server.name.clone();
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.await {
            tracing::debug!(server = %name, error = %e, "upstream HTTP/2 connection ended");
        }
        flag.set(true);
    });
    let opened = Opened {
        closed,
        idle_timeout: upstream.idle_timeout,
    };
    let conn = pool.borrow_mut().add(key, send, opened);
    Ok(Checkout::Lease(Lease::new(conn)))
}

/// The transport of a new connection; `None` when `auto` over TLS got HTTP/1.1.
async fn open(
    upstream: &Upstream,
    server: &UpstreamServer,
    tls: Option<&TlsUpstream>,
) -> Result<Option<UpstreamStream>, ProxyError> {
    let deadline = tokio::time::Instant::now() + upstream.connect_timeout;
    let tcp = connect(server.addr, upstream.connect_timeout).await?;
    let Some(tls) = tls else {
        return Ok(Some(UpstreamStream::Plain(tcp)));
    };
    let (stream, h2) = match tls.handshake_h2(server, tcp, deadline).await {
        Ok(pair) => pair,
        Err(e) => return Err(handshake_failed(upstream, server, tls, e)),
    };
    match (h2, upstream.protocol) {
        (true, _) => Ok(Some(stream)),
        (false, UpstreamProtocol::Auto) => Ok(None),
        (false, _) => {
            tracing::warn!(upstream = %upstream.name, server = %server.name, "the server did not agree to HTTP/2 (ALPN h2)");
            Err(ProxyError::UpstreamTls(
                "the server did not agree to ALPN h2",
            ))
        }
    }
}

/// The proxy error for an h2 failure talking to an upstream.
pub fn h2_error(e: &h2::Error) -> ProxyError {
    match e.get_io() {
        Some(io) => ProxyError::UpstreamIo(io.kind()),
        None if e.is_go_away() || e.is_reset() => ProxyError::UpstreamClosed,
        None => ProxyError::UpstreamMalformed("HTTP/2 protocol error from the upstream"),
    }
}

/// Whether the server says it never processed the stream that failed with `e` (RFC 9113
/// 8.7: REFUSED_STREAM, or a GOAWAY whose last stream id is below it): safe to retry.
pub fn never_processed(e: &h2::Error) -> bool {
    e.is_remote() && (e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM))
}
