//! A worker's QUIC endpoint for one bind of a TLS listener with `http3` on: a UDP socket
//! on the listener's address and port with SO_REUSEPORT (every worker has its own, as for
//! TCP), and the loop that takes incoming connections until the listener stops.
//!
//! Each connection is set up with the QUIC config of the snapshot current when it arrives
//! (`quic_config`, rebuilt when the snapshot changes): a reload's certificates, ACME
//! certificates (the listener's SNI resolver is shared) and settings apply to new
//! connections, as for TCP.
//!
//! At the listener's `max_connections` a newcomer takes the place of an idle connection of
//! the listener (HTTP/3, HTTP/1.1 or HTTP/2, or a handshake), as a TCP newcomer does
//! (`listener::reclaim`): the endpoint holds it until a close frees a place, taking no
//! other connection meanwhile (quinn queues them, as the kernel backlog queues TCP ones),
//! and refuses it only if none frees within the handshake's time (`handshake_timeout`).

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Weak};

use quinn::crypto::rustls::QuicServerConfig;
use socket2::{Domain, Protocol, Socket, Type};

use super::conn::{serve, Limits};
use crate::listener::backoff::ResourceLog;
use crate::listener::cap::{ListenerCap, Permit};
use crate::listener::reclaim::Reclaimer;
use crate::listener::StopSignal;
use crate::metrics::shard::Counter;
use crate::metrics::shard::Http3Metrics;
use crate::snapshot::Snapshot;
use crate::tls::ListenerTls;
use crate::worker::{ConnectionGuard, Worker};

/// Starts the endpoint of listener slot `slot` on `socket` ([`bind_udp`], bound by the
/// control plane with the TCP sockets); it stops with `stop`.
pub(crate) fn spawn(
    worker: Rc<Worker>,
    slot: usize,
    socket: std::net::UdpSocket,
    cap: ListenerCap,
    stop: Rc<StopSignal>,
) {
    tokio::task::spawn_local(run(worker, slot, socket, cap, stop));
}

/// New connections in the current second (`Rate::over`).
#[derive(Default)]
struct Rate {
    second: Option<std::time::Instant>,
    count: u32,
}

impl Rate {
    /// Counts a new connection; whether this second already had `threshold` (0: always).
    fn over(&mut self, threshold: u32) -> bool {
        let now = std::time::Instant::now();
        match self.second {
            Some(start) if now - start < std::time::Duration::from_secs(1) => {}
            _ => {
                self.second = Some(now);
                self.count = 0;
            }
        }
        self.count = self.count.saturating_add(1);
        self.count > threshold
    }
}

/// Binds a non-blocking UDP socket with SO_REUSEADDR and SO_REUSEPORT: one per worker, on
/// a TLS listener's address (its TCP port), bound with the TCP sockets so that a datagram
/// never finds the port closed while the listener is up (a client may take the ICMP port
/// unreachable that would answer it as "no HTTP/3 here").
pub(crate) fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A listener's QUIC setup in one snapshot.
#[derive(Clone)]
struct Setup {
    /// Weak: an endpoint that sees no new connection for days must not keep its snapshot
    /// (and so the metric slots of the servers DNS dropped since, `metrics::layout`).
    /// Compared by address, which a weak pointer keeps from being reused.
    snapshot: Weak<Snapshot>,
    config: Arc<quinn::ServerConfig>,
    tls: Arc<ListenerTls>,
    limits: Limits,
    retry_threshold: u32,
}

/// Takes the endpoint's incoming connections (each judged by [`admit`], served by
/// `conn::serve` on the snapshot's setup) until `stop`.
async fn run(
    worker: Rc<Worker>,
    slot: usize,
    socket: std::net::UdpSocket,
    cap: ListenerCap,
    stop: Rc<StopSignal>,
) {
    let Some(mut setup) = setup(&worker.snapshot(), slot) else {
        return;
    };
    let config = quinn::EndpointConfig::default();
    let runtime = Arc::new(quinn::TokioRuntime);
    let first = Some((*setup.config).clone());
    let endpoint = match quinn::Endpoint::new(config, first, socket, runtime) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the HTTP/3 endpoint");
            return;
        }
    };
    let mut rate = Rate::default();
    let mut at_cap = AtCap {
        reclaim: Reclaimer::asking(slot),
        log: ResourceLog::default(),
    };
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = stop.stopped() => None,
        };
        let Some(incoming) = incoming else {
            break;
        };
        let current = worker.snapshot();
        if !std::ptr::eq(Arc::as_ptr(&current), setup.snapshot.as_ptr()) {
            match self::setup(&current, slot) {
                Some(new) => setup = new,
                None => {
                    incoming.refuse();
                    continue;
                }
            }
        }
        let admitted = match admit(incoming, &worker, slot, &setup, &mut rate, &cap) {
            Admission::Admitted(connecting, permit) => Some((connecting, permit)),
            Admission::AtCap(incoming) => {
                let place = at_cap.place(&worker, &cap, &stop, setup.limits.handshake_timeout);
                match place.await {
                    Some(permit) => accept(*incoming, &worker, slot, &setup, permit),
                    None => {
                        refuse(*incoming, &worker, slot);
                        None
                    }
                }
            }
            Admission::Answered => None,
        };
        let Some((connecting, permit)) = admitted else {
            continue;
        };
        let guard = ConnectionGuard::new(worker.clone(), slot, permit);
        let conn = serve(guard, connecting, setup.tls.clone(), setup.limits);
        tokio::task::spawn_local(conn);
        // The new connection takes its handshake place on its first poll: let it run
        // before the next Initial is judged against `max_handshakes` (a burst read at
        // once would otherwise all find the places free).
        tokio::task::yield_now().await;
    }
    // New connections are refused from here; those open finish on their own (the
    // endpoint's driver runs while any does).
    endpoint.set_server_config(None);
}

/// What [`admit`] made of an incoming connection.
enum Admission {
    /// Its handshake started, with its place under the listener's cap.
    Admitted(quinn::Connecting, Permit),
    /// The listener is at its cap: an idle connection is to give way ([`AtCap`]). Boxed:
    /// an `Incoming` is large, and rare here.
    AtCap(Box<quinn::Incoming>),
    /// Answered with a Retry, or refused (counted).
    Answered,
}

/// Judges `incoming` on listener slot `slot`: its handshake starts, with its place under
/// the listener's connection cap, or it waits for one, or it is answered with a Retry or
/// refused (counted).
fn admit(
    incoming: quinn::Incoming,
    worker: &Worker,
    slot: usize,
    setup: &Setup,
    rate: &mut Rate,
    cap: &ListenerCap,
) -> Admission {
    let count = |pick| count(worker, slot, pick);
    // Under a flood of Initials (spoofed sources among them), a client proves its
    // address with a Retry round trip before any handshake work is done for it. So
    // does one that would take a handshake place from another (TLS over TCP's
    // included) at `max_handshakes`, or an idle connection's at `max_connections`: an
    // Initial costs nothing to spoof, and one that may evict needs a return path, as a
    // TCP connection does.
    let unproven = !incoming.remote_address_validated();
    if unproven
        && (rate.over(setup.retry_threshold)
            || worker.handshakes.occupied(slot) >= setup.tls.max_handshakes
            || !cap.is_below())
    {
        if incoming.retry().is_ok() {
            count(|m| &m.retries);
        }
        return Admission::Answered;
    }
    if worker.is_draining() {
        refuse(incoming, worker, slot);
        return Admission::Answered;
    }
    let Some(permit) = cap.try_acquire() else {
        return Admission::AtCap(Box::new(incoming));
    };
    match accept(incoming, worker, slot, setup, permit) {
        Some((connecting, permit)) => Admission::Admitted(connecting, permit),
        None => Admission::Answered,
    }
}

/// Starts the handshake of `incoming` in its place `permit` (`None`: it failed at once,
/// counted).
fn accept(
    incoming: quinn::Incoming,
    worker: &Worker,
    slot: usize,
    setup: &Setup,
    permit: Permit,
) -> Option<(quinn::Connecting, Permit)> {
    let Ok(connecting) = incoming.accept_with(setup.config.clone()) else {
        count(worker, slot, |m| &m.handshake_failures);
        return None;
    };
    Some((connecting, permit))
}

/// Refuses `incoming` (counted in `weir_http3_refused_total`).
fn refuse(incoming: quinn::Incoming, worker: &Worker, slot: usize) {
    count(worker, slot, |m| &m.refused);
    incoming.refuse();
}

/// Counts an event of listener slot `slot` in the HTTP/3 counter `pick` chooses.
fn count(worker: &Worker, slot: usize, pick: fn(&Http3Metrics) -> &Counter) {
    if let Some(m) = worker.metrics.listener(slot) {
        pick(&m.http3).inc();
    }
}

/// The endpoint's side of reclaiming places at the cap, and its rate-limited log of
/// pauses.
struct AtCap {
    reclaim: Reclaimer,
    log: ResourceLog,
}

impl AtCap {
    /// A place for a newcomer at the cap: an idle connection of the listener closes for
    /// it (this worker's, or another's when this one has none), within `bound`. `None`:
    /// none freed a place in time, or the worker drains or the listener stops first.
    async fn place(
        &mut self,
        worker: &Worker,
        cap: &ListenerCap,
        stop: &StopSignal,
        bound: std::time::Duration,
    ) -> Option<Permit> {
        let place = self.reclaim.place_for(worker, cap, &mut self.log, stop);
        crate::time::with_timeout(bound, place).await.ok().flatten()
    }
}

/// The QUIC setup of listener slot `slot` in `snapshot`; `None` when the listener is gone
/// or no longer has `http3` (or TLS).
fn setup(snapshot: &Arc<Snapshot>, slot: usize) -> Option<Setup> {
    let index = snapshot.listener_index(slot)?;
    let listener = &snapshot.config.listeners[index];
    let http3 = listener.http3.as_ref()?;
    let tls = snapshot.listeners[index].tls.clone()?;
    let config = match quic_config(&tls, http3) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(listener = %listener.name, error = %e, "cannot set up HTTP/3");
            return None;
        }
    };
    Some(Setup {
        snapshot: Arc::downgrade(snapshot),
        config: Arc::new(config),
        limits: Limits {
            handshake_timeout: tls.handshake_timeout,
            max_handshakes: tls.max_handshakes,
            header_timeout: listener.header_timeout,
            keepalive_timeout: listener.keepalive_timeout,
            max_field_section_size: u64::from(http3.max_field_section_size),
            early_data: http3.early_data,
            resets: (listener.http2.reset_budget, listener.http2.reset_window),
            glitches: (listener.http2.glitch_budget, listener.http2.glitch_window),
        },
        retry_threshold: http3.retry_threshold,
        tls,
    })
}

/// The quinn server config for a listener: its rustls config (the same certificate
/// resolver, ticket keys and client verification) with ALPN `h3`, 0-RTT only with
/// `early_data`, and the listener's `http3` limits as QUIC transport parameters.
fn quic_config(
    tls: &ListenerTls,
    http3: &weir_config::Http3,
) -> Result<quinn::ServerConfig, String> {
    let mut crypto = (*tls.server_config).clone();
    crypto.alpn_protocols = vec![b"h3".to_vec()];
    crypto.max_early_data_size = 0;
    if http3.early_data {
        // QUIC takes 0 or u32::MAX (RFC 9001 4.6.1: flow control bounds early data).
        crypto.max_early_data_size = u32::MAX;
        // rustls accepts early data only on sessions it keeps (stateful tickets, in the
        // listener's session cache): each is taken once, so the same first flight sent
        // again to this process resumes nothing.
        crypto.ticketer = Arc::new(StatefulTickets);
    }
    let crypto = QuicServerConfig::try_from(crypto).map_err(|e| e.to_string())?;
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(http3.idle_timeout).map_err(|e| e.to_string())?;
    transport
        .max_concurrent_bidi_streams(http3.max_concurrent_streams.into())
        // HTTP/3's control stream and QPACK's two, with room for a peer's extensions.
        .max_concurrent_uni_streams(8u32.into())
        .stream_receive_window(http3.stream_window.into())
        .receive_window(http3.connection_window.into())
        .max_idle_timeout(Some(idle));
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// No ticket encryption: tickets are ids of sessions in the listener's session cache
/// (rustls's stateful resumption, which 0-RTT needs).
#[derive(Debug)]
struct StatefulTickets;

impl rustls::server::ProducesTickets for StatefulTickets {
    fn enabled(&self) -> bool {
        false
    }

    fn lifetime(&self) -> u32 {
        0
    }

    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}
