//! One QUIC connection speaking HTTP/3: the handshake (`handshake`: waited for, or with
//! 0-RTT watched while the connection is served), the h3 server with the listener's
//! `max_field_section_size` on the watched connection (`guard`), a task per request
//! stream, the reset and glitch budgets (past them: H3_EXCESSIVE_LOAD), and the graceful
//! close on drain (GOAWAY, then the streams in flight finish). The connection counts among
//! its listener's connections (drain, `max_connections`) for as long as it lives.
//!
//! While no request is under way (before the first, and whenever the last ends) the
//! connection is idle, as an HTTP/2 connection with no stream (`http2::conn`): its seat
//! among its worker's idle connections (`places`) rests, so at the listener's
//! `max_connections` a newcomer of either transport may take its place
//! (`listener::reclaim`; the connection sends GOAWAY and closes with H3_NO_ERROR: no
//! request is lost), and it closes (GOAWAY, then H3_NO_ERROR) once idle for
//! `header_timeout` before its first request, `keepalive_timeout` after one. A request is
//! under way from its head on: a stream opened with no head yet (HTTP/2 opens none before
//! HEADERS) does not make the connection busy, else one empty stream every few seconds
//! would hold a place for ever. QUIC PINGs and control-stream frames are no requests:
//! they keep the QUIC connection alive (`idle_timeout`), not its place. Every wait on the
//! client's flow control (the control stream's setup, the GOAWAY) is bounded: a client
//! that gives no credit cannot freeze the connection's task, nor keep its place.

use std::cell::Cell;
use std::future::poll_fn;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h3::server::RequestResolver;
use tokio::sync::Notify;

use super::guard::Guarded;
use super::handshake::{self, Confirmation};
use crate::filters::forwarded::ClientIp;
use crate::http2::budget::Budget;
use crate::metrics::shard::{Counter, Http3Metrics};
use crate::places::IdlePlace;
use crate::tls::session::TlsSession;
use crate::tls::ListenerTls;
use crate::worker::{ConnectionGuard, Worker};

/// What a connection's stream tasks share with it.
pub(super) struct Conn {
    pub worker: Rc<Worker>,
    pub slot: usize,
    pub ip: ClientIp,
    pub peer_ip: IpAddr,
    /// The handshake's facts (SNI, client certificate), for forwarded headers, `{scheme}`
    /// and the access log.
    pub tls: TlsSession,
    /// Whether the handshake is still under way (0-RTT: requests now are early data).
    pub handshake: Confirmation,
    /// The QUIC connection (closed when a budget is exceeded).
    quic: quinn::Connection,
    /// Streams the client reset or stopped, and glitches (`guard`), in their windows (the
    /// listener's `http2` budgets).
    resets: Budget,
    glitches: Budget,
    /// Stream tasks running (a head awaited or a request served), and the signal each
    /// gives when it ends (a draining connection closes once none runs).
    active: Cell<usize>,
    ended: Notify,
    /// Requests under way (their head read): while there are none the connection is idle.
    serving: Cell<usize>,
    /// Whether a request's head was read: `keepalive_timeout` bounds the idle time from
    /// then, `header_timeout` before.
    served: Cell<bool>,
    /// When the last request ended (or the connection was set up): the idle timeout
    /// counts from there.
    idle_since: Cell<Instant>,
    /// The connection's seat among the worker's idle connections, resting while no
    /// request is under way.
    idle: IdlePlace,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.idle.close(&self.worker.idle);
    }
}

impl Conn {
    /// What a stream of this connection needs of it (and of the listener at `listener`
    /// in `snapshot`) for its exchange and its log.
    pub(super) fn stream_conn<'a>(
        &'a self,
        snapshot: &'a crate::snapshot::Snapshot,
        listener: usize,
    ) -> crate::http2::stream_log::StreamConn<'a> {
        crate::http2::stream_log::StreamConn {
            worker: &self.worker,
            snapshot,
            listener,
            slot: self.slot,
            peer_ip: self.peer_ip,
            ip: &self.ip,
            tls: Some(&self.tls),
            protocol: crate::metrics::shard::Protocol::Http3,
        }
    }

    /// The QUIC connection (its close ends every stream's wait: `upstream`).
    pub fn quic(&self) -> &quinn::Connection {
        &self.quic
    }

    /// The client reset (or stopped) a request stream before its response ended, or sent
    /// a malformed head: not a send Weir gave up (`body::client_error`).
    pub fn reset_by_client(&self) {
        // Every stream fails with a connection that closed: those are no resets.
        if self.quic.close_reason().is_some() {
            return;
        }
        self.spend(&self.resets, |m| &m.client_resets, b"reset budget exceeded");
    }

    /// The client did something that carries no request (`guard`).
    pub fn glitch(&self) {
        self.spend(&self.glitches, |m| &m.glitches, b"glitch budget exceeded");
    }

    /// Counts one event in `counter` and `budget`; past the budget the connection closes
    /// with H3_EXCESSIVE_LOAD (HTTP/2's GOAWAY ENHANCE_YOUR_CALM; the streams in flight
    /// end with it).
    fn spend(&self, budget: &Budget, counter: fn(&Http3Metrics) -> &Counter, why: &[u8]) {
        let metrics = self.worker.metrics.listener(self.slot).map(|m| &m.http3);
        if let Some(m) = metrics {
            counter(m).inc();
        }
        let was = budget.is_exceeded();
        if budget.record(Instant::now()) && !was {
            self.overload(why);
        }
    }

    /// Closes the connection with H3_EXCESSIVE_LOAD (`why` its reason), counted in
    /// `weir_http3_excessive_load_closes_total`.
    pub fn overload(&self, why: &[u8]) {
        if self.quic.close_reason().is_some() {
            return;
        }
        if let Some(m) = self.worker.metrics.listener(self.slot) {
            m.http3.excessive_load_closes.inc();
        }
        self.quic.close(H3_EXCESSIVE_LOAD.into(), why);
    }
}

/// The limits a connection is set up with, from its listener.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub handshake_timeout: Duration,
    /// The listener's TLS `max_handshakes` (per worker, shared with TLS over TCP).
    pub max_handshakes: usize,
    pub header_timeout: Duration,
    /// Idle time allowed after a request (`header_timeout` bounds it before the first).
    pub keepalive_timeout: Duration,
    pub max_field_section_size: u64,
    /// 0-RTT: the connection is served during its handshake.
    pub early_data: bool,
    /// The listener's `http2` reset and glitch budgets (each: how many per window).
    pub resets: (u32, Duration),
    pub glitches: (u32, Duration),
}

/// Serves the connection `connecting` (a handshake under way) until it closes.
pub(super) async fn serve(
    guard: ConnectionGuard,
    connecting: quinn::Connecting,
    tls: Arc<ListenerTls>,
    limits: Limits,
) {
    let (worker, slot) = (guard.worker().clone(), guard.slot());
    let started = handshake::start(&worker, slot, connecting, limits).await;
    let Some((connection, accepted)) = started else {
        return;
    };
    let stats = connection.clone();
    let sni = connection
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(String::into_boxed_str);
    let peer = connection.peer_identity().and_then(|p| {
        p.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()
    });
    // As over TCP (`tls::handshake`): a completed handshake without a certificate where
    // one is required is refused, whatever session it resumed. (A 0-RTT connection's
    // certificate may still be on its way here; its session's policy is the setup's.)
    if accepted.is_none() && peer.is_none() && tls.requires_client_cert() {
        connection.close(H3_NO_ERROR.into(), b"client certificate required");
        return;
    }
    let peer_ip = connection.remote_address().ip().to_canonical();
    let now = Instant::now();
    let conn = Rc::new(Conn {
        worker: worker.clone(),
        slot,
        ip: ClientIp::new(peer_ip),
        peer_ip,
        tls: TlsSession::quic(sni, peer.as_deref().map(|c| &c[..]), &tls),
        handshake: Confirmation::new(accepted.is_some().then(|| connection.clone())),
        quic: connection.clone(),
        resets: Budget::new(limits.resets.0, limits.resets.1),
        glitches: Budget::new(limits.glitches.0, limits.glitches.1),
        active: Cell::new(0),
        ended: Notify::new(),
        serving: Cell::new(0),
        served: Cell::new(false),
        idle_since: Cell::new(now),
        idle: IdlePlace::new(&worker.idle, slot, now),
    });
    // Idle until its first request stream: one that never opens any can be reclaimed.
    conn.idle.rest(&worker.idle, now);
    drop(tls);
    // A 0-RTT connection is served while its handshake is watched.
    let watching = async {
        if let Some(accepted) = accepted {
            handshake::watch(&worker, slot, &stats, accepted, limits).await;
        }
    };
    tokio::join!(watching, run(connection, &conn, limits));
    // The connection's packet statistics, once it is over.
    if let Some(m) = worker.metrics.listener(slot).map(|m| &m.http3) {
        let path = stats.stats().path;
        m.sent_packets.add(path.sent_packets);
        m.lost_packets.add(path.lost_packets);
        m.congestion_events.add(path.congestion_events);
    }
    stats.close(H3_NO_ERROR.into(), b"");
    drop(guard);
}

/// Runs the h3 server on `connection` until it closes, is drained or gives way.
async fn run(connection: quinn::Connection, conn: &Rc<Conn>, limits: Limits) {
    let mut h3 = match set_up(connection, conn, limits).await {
        Ok(h3) => h3,
        Err(why) => return conn.quic.close(H3_NO_ERROR.into(), why),
    };
    let end = accept_streams(&mut h3, conn, limits).await;
    conn.idle.close(&conn.worker.idle);
    if end == End::GaveWay {
        // No request runs: GOAWAY tells the client none was lost (as HTTP/2's does). The
        // newcomer waits for this close (an HTTP/3 one holds up its endpoint meanwhile),
        // so no wait for the client's credit or acknowledgement: the GOAWAY goes if it
        // can at once (one turn for the connection's driver to send it), and the close
        // says H3_NO_ERROR anyway.
        let _ = crate::time::with_timeout(Duration::ZERO, h3.shutdown(0)).await;
        tokio::task::yield_now().await;
        conn.quic
            .close(H3_NO_ERROR.into(), b"idle connection closed for a new one");
    }
    // The GOAWAY and the last responses' data may still wait for their acknowledgement,
    // which closing now would discard. A few round trips let them arrive (or the client
    // close first); then the connection closes with H3_NO_ERROR.
    let _ = tokio::time::timeout(grace(&conn.quic), conn.quic.closed()).await;
}

/// How long a closing connection waits for its last frames to arrive: a few round trips,
/// at most 2 s.
fn grace(quic: &quinn::Connection) -> Duration {
    (quic.rtt() * 4 + Duration::from_millis(50)).min(Duration::from_secs(2))
}

/// Sets up the h3 server on `connection` (it opens its control stream and sends its
/// SETTINGS), within `header_timeout`: a client that gives no credit for them would
/// keep it waiting for ever. Meanwhile the connection is idle: a newcomer at the cap may
/// take its place, and a drain ends it. `Err`: the reason to close it with.
async fn set_up(
    connection: quinn::Connection,
    conn: &Rc<Conn>,
    limits: Limits,
) -> Result<h3::server::Connection<Guarded, Bytes>, &'static [u8]> {
    let mut builder = h3::server::builder();
    let build = builder
        .max_field_section_size(limits.max_field_section_size)
        .build::<_, Bytes>(Guarded::new(
            h3_quinn::Connection::new(connection),
            conn.clone(),
            limits.max_field_section_size,
        ));
    let worker = &conn.worker;
    tokio::select! {
        built = crate::time::with_timeout(limits.header_timeout, build) => match built {
            Ok(Ok(h3)) => Ok(h3),
            Ok(Err(_)) => Err(b"HTTP/3 setup failed"),
            Err(_) => Err(b"HTTP/3 not set up in time"),
        },
        () = poll_fn(|cx| conn.idle.poll_taken(&worker.idle, cx)) => {
            Err(b"idle connection closed for a new one")
        }
        () = worker.drained() => Err(b"draining"),
    }
}

/// How [`accept_streams`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The connection closed or failed, or it is done closing (drained, idle too long).
    Closed,
    /// At `max_connections` a newcomer took its place while no stream ran.
    GaveWay,
}

/// Starts a task per request stream until the connection ends; on drain or once idle too
/// long, GOAWAY first; at the cap, while idle, it gives way to a newcomer.
async fn accept_streams(
    h3: &mut h3::server::Connection<Guarded, Bytes>,
    conn: &Rc<Conn>,
    limits: Limits,
) -> End {
    let worker = conn.worker.clone();
    let drained = worker.drained();
    // Before the first request: `header_timeout`, as for a new HTTP/1.1 connection.
    let timer = tokio::time::sleep(limits.header_timeout);
    tokio::pin!(drained, timer);
    let mut closing = false;
    loop {
        tokio::select! {
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    // Its request may come now, and end before the timer would fire for
                    // `keepalive_timeout` after it: the timer looks again by then.
                    let soon = Instant::now() + limits.keepalive_timeout.min(limits.header_timeout);
                    if timer.deadline() > soon.into() {
                        timer.as_mut().reset(soon.into());
                    }
                    let stream = request(Running::new(conn), resolver, limits.header_timeout);
                    tokio::task::spawn_local(stream);
                }
                // Closed by the client, idle, or failed.
                _ => return End::Closed,
            },
            () = &mut drained, if !closing => {
                // GOAWAY: no new streams; those in flight finish, then the connection
                // closes.
                close_gracefully(h3, conn).await;
                closing = true;
            }
            () = &mut timer, if !closing => match idle_deadline(conn, limits) {
                Some(deadline) => timer.as_mut().reset(deadline.into()),
                None => {
                    close_gracefully(h3, conn).await;
                    closing = true;
                }
            },
            () = poll_fn(|cx| conn.idle.poll_taken(&worker.idle, cx)), if !closing => {
                if conn.serving.get() == 0 {
                    return End::GaveWay;
                }
                // Its place taken just as a request's head came: served, then the
                // connection closes (as an HTTP/2 one does).
                close_gracefully(h3, conn).await;
                closing = true;
            }
            () = conn.ended.notified(), if closing => {}
        }
        if closing && conn.active.get() == 0 {
            return End::Closed;
        }
    }
}

/// GOAWAY (no new streams; those in flight finish), and the connection's place is no
/// newcomer's to take any more (it is closing). The GOAWAY waits for the client's flow
/// control credit on the control stream a few round trips at most: without it the
/// connection closes at once (H3_NO_ERROR), else a client could hold it for ever.
async fn close_gracefully(h3: &mut h3::server::Connection<Guarded, Bytes>, conn: &Conn) {
    conn.idle.close(&conn.worker.idle);
    let sent = crate::time::with_timeout(grace(&conn.quic), h3.shutdown(0)).await;
    if sent.is_err() {
        conn.quic
            .close(H3_NO_ERROR.into(), b"GOAWAY not taken in time");
    }
}

/// The idle timer fired: `None` when the connection has had no request under way for
/// its idle bound (`header_timeout` before its first, `keepalive_timeout` after), else
/// when to look again (while requests run, in a while: at least a second, so a
/// `keepalive_timeout` of 0 does not spin). Also `None` once a reload removed the
/// listener (or shut this connection out by a new client-auth policy): a busy connection
/// notices here, as an HTTP/2 one does, instead of refusing new requests until it idles.
fn idle_deadline(conn: &Conn, limits: Limits) -> Option<Instant> {
    let snapshot = conn.worker.snapshot();
    snapshot.serving_index(conn.slot, Some(&conn.tls))?;
    let idle = match conn.served.get() {
        true => limits.keepalive_timeout,
        false => limits.header_timeout,
    };
    crate::http2::next_idle_look(conn.idle_since.get(), conn.serving.get(), idle)
}

/// Reads a stream's request head (within `header_timeout`) and serves it.
async fn request(
    mut running: Running,
    resolver: RequestResolver<Guarded, Bytes>,
    header_timeout: Duration,
) {
    let conn = running.conn.clone();
    let resolved = crate::time::with_timeout(header_timeout, resolver.resolve_request()).await;
    let (request, stream) = match resolved {
        Ok(Ok(resolved)) => resolved,
        // Reset before its head was read, or a malformed head (h3 reset the stream): a
        // reset, for the budget as for HTTP/2's (resets forced by the client's errors
        // included).
        Ok(Err(_)) => return conn.reset_by_client(),
        Err(_) => return,
    };
    running.serving();
    let (send, recv) = stream.split();
    let send = super::send::SendHalf::new(send);
    super::stream::serve(
        conn,
        super::stream::Resolved {
            request,
            send,
            recv,
        },
    )
    .await;
}

/// HTTP/3's NO_ERROR code, closing a connection on purpose (RFC 9114 8.1).
const H3_NO_ERROR: u32 = 0x100;
/// HTTP/3's EXCESSIVE_LOAD code: the peer's behaviour generates excessive load.
const H3_EXCESSIVE_LOAD: u32 = 0x107;

/// Counts a stream task among its connection's running ones while it lives, and among
/// its requests under way once its head was read ([`serving`](Self::serving)): the first
/// makes the connection busy, the last to end idle from then.
struct Running {
    conn: Rc<Conn>,
    serving: bool,
}

impl Running {
    fn new(conn: &Rc<Conn>) -> Running {
        conn.active.set(conn.active.get() + 1);
        Running {
            conn: conn.clone(),
            serving: false,
        }
    }

    /// The stream's head was read: a request is under way. (Its place taken just now:
    /// the accept loop sees it, and closes the connection once this request is served.)
    fn serving(&mut self) {
        let conn = &self.conn;
        conn.served.set(true);
        conn.serving.set(conn.serving.get() + 1);
        if conn.serving.get() == 1 {
            conn.idle.busy(&conn.worker.idle);
        }
        self.serving = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let conn = &self.conn;
        if self.serving {
            conn.serving.set(conn.serving.get() - 1);
            if conn.serving.get() == 0 {
                let now = Instant::now();
                conn.idle_since.set(now);
                conn.idle.rest(&conn.worker.idle, now);
            }
        }
        conn.active.set(conn.active.get() - 1);
        // A stored permit if the accept loop is not waiting yet: no wake-up is lost.
        conn.ended.notify_one();
    }
}
