//! TCP (L4) listeners: each accepted connection is relayed byte for byte to a server of
//! the listener's upstream pool.
//!
//! ```text
//! accept (listener/) -> [PROXY header in, if accept = true (listener/proxy_protocol)]
//!   -> pick a server (upstream/) -> connect, next server on failure (retry policy)
//!   -> [PROXY header out, if send = v1|v2] -> relay both ways until closed, idle or a half-closed tail is still (relay)
//! ```
//!
//! - `io`: reads and writes on a shared `&TcpStream` driven by readiness
//! - `relay`: the two directions, buffered copy or splice(2), half-close, idle and fin timeouts (`crate::idle`)
//! - `sni`: with `sni_routes`, the upstream is chosen by the ClientHello's server name
//! - `tls_relay`: the relay when the upstream has `tls` (TLS origination)
//! - `offload`: with `[listeners.tls]`, the client's TLS is terminated and plaintext relayed

pub mod io;
mod offload;
mod relay;
pub mod sni;
mod tls_relay;

pub use relay::{relay, End, RelayConfig};
pub use tls_relay::relay_tls;

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use tokio::net::TcpStream;
use weir_config::{Listener, TcpSettings};

use crate::buffer::Buffer;
use crate::codec::proxy_protocol::{self, Addresses};
use crate::connector::{connect, handshake, UpstreamStream};
use crate::filters::forwarded::ClientIp;
use crate::listener::proxy_protocol::accept_step;
use crate::places::Place;
use crate::snapshot::Snapshot;
use crate::upstream::retry::{Outcome, Tried};
use crate::upstream::{Pick, RequestKey};
use crate::worker::Worker;

/// Serves one connection of the TCP listener with metric slot `slot` until it closes.
pub async fn serve_tcp(worker: Rc<Worker>, slot: usize, client: TcpStream, peer: SocketAddr) {
    let snapshot = worker.snapshot();
    let Some(listener_index) = snapshot.listener_index(slot) else {
        return;
    };
    let listener = &snapshot.config.listeners[listener_index];
    let Some(tcp) = listener.tcp() else { return };
    let mut to_server = worker.take_buffer_sized(tcp.buffer_size);
    let at = crate::listener::Slot { slot, listener };
    let idle = idle_place(&worker, at, tcp);
    let step = accept_step(
        &worker,
        at,
        &client,
        peer,
        &mut to_server,
        tcp.preread_timeout,
    );
    let Some(Ok(carried)) = unless_taken(idle.as_ref(), step).await else {
        worker.give_buffer(to_server);
        return;
    };
    // The IPv4 form of a mapped address, as HTTP listeners take it: one client, one key.
    let source = carried.map_or(peer, |a| a.source);
    let source = std::net::SocketAddr::new(source.ip().to_canonical(), source.port());
    if let Some(tls) = &snapshot.listeners[listener_index].tls {
        // The handshake takes its own evictable place (`tls::handshake`).
        drop(idle);
        let client = Accepted {
            client,
            peer,
            carried,
            to_server,
        };
        return serve_offloaded(&worker, &snapshot, at, tls, client).await;
    }
    let chosen = choose_upstream(&worker, slot, tcp, &client, &mut to_server);
    let chosen = unless_taken(idle.as_ref(), chosen).await;
    // The ClientHello is whole (or there was none to wait for): the client is ready.
    drop(idle);
    let Some(Some(upstream)) = chosen else {
        worker.give_buffer(to_server);
        return;
    };
    let Some((server, pick)) = connect_upstream(&worker, &snapshot, upstream, source).await else {
        worker.give_buffer(to_server);
        return;
    };
    let local = || client.local_addr().unwrap_or(listener.first_addr());
    if !send_proxy_header(&server, listener, local, peer, carried).await {
        worker.give_buffer(to_server);
        return;
    }
    let Some(m) = worker.metrics.listener(slot) else {
        worker.give_buffer(to_server);
        return;
    };
    let config = RelayConfig {
        limits: relay_limits(tcp),
        splice: tcp.splice,
        splice_available: worker.shared.splice_available,
        bytes_in: &m.bytes_in,
        bytes_out: &m.bytes_out,
    };
    // Client bytes that came with the PROXY header were not counted by the relay.
    m.bytes_in.add(to_server.len() as u64);
    let target = Target {
        snapshot: &snapshot,
        upstream,
        server: pick.server,
    };
    let end = relay_to(&worker, target, &client, server, to_server, &config).await;
    if let Some(end) = end {
        crate::idle::count(&worker, slot, end);
    }
    tracing::trace!(listener = %listener.name, %source, ?end, "tcp connection ended");
    // `pick` lives until here: the connection counts as in flight to its server.
}

/// Until its relay starts a connection of listener `at` is idle: a newcomer at
/// max_connections may take its place (`listener::reclaim`), the idlest (oldest accept)
/// first. A listener with no step before the relay takes no place (nothing to wait for,
/// nothing spent).
fn idle_place<'w>(
    worker: &'w Worker,
    at: crate::listener::Slot<'_>,
    tcp: &TcpSettings,
) -> Option<Place<'w>> {
    let waits = at.listener.proxy_protocol.accept || !tcp.sni_routes.is_empty();
    let now = std::time::Instant::now();
    waits.then(|| worker.idle.enter(at.slot, usize::MAX, now))
}

/// `step`'s output, unless a newcomer at `max_connections` takes the connection's idle
/// place first (`None`: close). A taken place wins over a step that ends in the same turn:
/// the newcomer's worker counted this connection closed and waits for its place, and a
/// relay, unlike a TLS handshake, would hold it up to `idle_timeout`.
async fn unless_taken<F: std::future::Future>(
    idle: Option<&Place<'_>>,
    step: F,
) -> Option<F::Output> {
    let Some(idle) = idle else {
        return Some(step.await);
    };
    tokio::select! {
        biased;
        () = idle.taken() => None,
        out = step => Some(out),
    }
}

/// The still-time bounds of a TCP listener's relays.
fn relay_limits(tcp: &TcpSettings) -> crate::idle::Limits {
    crate::idle::Limits {
        idle: tcp.idle_timeout,
        fin: tcp.fin_timeout,
        min_progress: tcp.min_progress,
    }
}

/// An accepted connection of a TLS listener, before its handshake: `to_server` holds the
/// bytes read after any PROXY header (`carried`).
struct Accepted {
    client: TcpStream,
    peer: SocketAddr,
    carried: Option<Addresses>,
    to_server: Buffer,
}

/// Server `server` of upstream `upstream` in `snapshot`.
#[derive(Clone, Copy)]
struct Target<'a> {
    snapshot: &'a Snapshot,
    upstream: usize,
    server: usize,
}

/// A TLS listener's connection: the handshake (after any PROXY header), the upstream (by
/// the settled SNI name with `sni_routes`), then the plaintext relay (see `offload`).
async fn serve_offloaded(
    worker: &Worker,
    snapshot: &Snapshot,
    at: crate::listener::Slot<'_>,
    tls: &crate::tls::ListenerTls,
    accepted: Accepted,
) {
    let crate::listener::Slot { slot, listener } = at;
    let Accepted {
        client,
        peer,
        carried,
        mut to_server,
    } = accepted;
    let Some(tcp) = listener.tcp() else { return };
    let send = listener.proxy_protocol.send != weir_config::ProxyVersion::Off;
    let local = send.then(|| offload::local_addr(&client, listener));
    let terminated = offload::terminate(worker, at, tls, client, &mut to_server);
    let Some((mut client, session)) = terminated.await else {
        worker.give_buffer(to_server);
        return;
    };
    let upstream = offload::choose_upstream(worker, slot, tcp, &session);
    // The IPv4 form of a mapped address, as HTTP listeners take it: one client, one key.
    let source = carried.map_or(peer, |a| a.source);
    let source = std::net::SocketAddr::new(source.ip().to_canonical(), source.port());
    let Some((server, pick)) = connect_upstream(worker, snapshot, upstream, source).await else {
        worker.give_buffer(to_server);
        return;
    };
    let local = || local.unwrap_or(listener.first_addr());
    let sent = send_proxy_header(&server, listener, local, peer, carried).await;
    let target = Target {
        snapshot,
        upstream,
        server: pick.server,
    };
    let server = match (sent, worker.metrics.listener(slot)) {
        (true, Some(m)) => originate(worker, target, server).await.map(|s| (s, m)),
        _ => None,
    };
    let Some((mut server, m)) = server else {
        worker.give_buffer(to_server);
        return;
    };
    let config = RelayConfig {
        limits: relay_limits(tcp),
        splice: weir_config::SpliceMode::Never,
        splice_available: false,
        bytes_in: &m.bytes_in,
        bytes_out: &m.bytes_out,
    };
    let end = offload::relay(worker, &mut client, &mut server, to_server, &config).await;
    crate::idle::count(worker, slot, end);
    let sni = session.sni.as_deref();
    tracing::trace!(listener = %listener.name, %source, ?sni, ?end, "tls tcp connection ended");
    drop(pick);
}

/// Relays between the client and the server: plain, or over TLS when upstream `upstream`
/// has `tls` (the handshake comes after any PROXY header; a failed one counts as a connect
/// error and closes the client, `None`).
async fn relay_to(
    worker: &Worker,
    target: Target<'_>,
    client: &TcpStream,
    server: TcpStream,
    to_server: Buffer,
    config: &RelayConfig<'_>,
) -> Option<End> {
    if target.snapshot.upstreams[target.upstream].tls.is_none() {
        return Some(relay(worker, client, &server, to_server, config).await);
    }
    match originate(worker, target, server).await {
        Some(mut tls) => Some(relay_tls(worker, client, &mut tls, to_server, config).await),
        None => {
            worker.give_buffer(to_server);
            None
        }
    }
}

/// The server connection as the upstream speaks it: plain, or after the TLS handshake when
/// the upstream has `tls` (a failed handshake counts as a connect error: `None`).
async fn originate(
    worker: &Worker,
    target: Target<'_>,
    server: TcpStream,
) -> Option<UpstreamStream> {
    let Target {
        snapshot,
        upstream,
        server: server_index,
    } = target;
    let plan = &snapshot.upstreams[upstream];
    let Some(tls) = &plan.tls else {
        return Some(UpstreamStream::from(server));
    };
    let u = &snapshot.config.upstreams[upstream];
    let deadline = tokio::time::Instant::now() + u.connect_timeout;
    match handshake(u, &u.servers[server_index], tls, server, deadline).await {
        Ok(tls) => Some(tls),
        Err(_) => {
            let slot = plan.server_slots[server_index];
            if let Some(m) = worker.metrics.server(plan.slot, slot) {
                m.connect_errors.inc();
            }
            None
        }
    }
}

/// The upstream for this connection: the listener's, or with `sni_routes` the one the
/// ClientHello's server name picks (read into `buf`, counted). `None`: close.
async fn choose_upstream(
    worker: &Worker,
    slot: usize,
    tcp: &TcpSettings,
    client: &TcpStream,
    buf: &mut Buffer,
) -> Option<usize> {
    if tcp.sni_routes.is_empty() {
        return Some(tcp.upstream);
    }
    let (upstream, result) = sni::choose_upstream(client, tcp, buf).await;
    if let Some(m) = worker.metrics.listener(slot) {
        m.sni[result as usize].inc();
    }
    tracing::debug!(result = result.label(), ?upstream, "tcp sni routing");
    upstream
}

/// Connects to a server of upstream `index`, trying others on connect failure as the
/// upstream's retry policy allows. `None`: no server could be reached.
async fn connect_upstream(
    worker: &Worker,
    snapshot: &Snapshot,
    index: usize,
    source: SocketAddr,
) -> Option<(TcpStream, Pick)> {
    let upstream = &snapshot.config.upstreams[index];
    let plan = &snapshot.upstreams[index];
    let key = RequestKey::for_connection(&upstream.lb, &ClientIp::new(source.ip()));
    let Some(mut pick) = worker.upstreams.pick(index, plan, upstream, key) else {
        tracing::warn!(upstream = %upstream.name, "no server available for a tcp connection");
        return None;
    };
    let mut tried = Tried::new(pick.server);
    loop {
        let server = &upstream.servers[pick.server];
        let started = Instant::now();
        let result = connect(server.addr, upstream.connect_timeout).await;
        let elapsed = started.elapsed();
        let metrics = worker
            .metrics
            .server(plan.slot, plan.server_slots[pick.server]);
        match result {
            Ok(stream) => {
                pick.record(plan, upstream, Outcome::Connected, elapsed);
                if let Some(m) = metrics {
                    m.connect.observe(elapsed);
                }
                return Some((stream, pick));
            }
            Err(error) => {
                let outcome = Outcome::of_error(error);
                pick.record(plan, upstream, outcome, elapsed);
                if let (Some(m), Outcome::ConnectError) = (metrics, outcome) {
                    m.connect_errors.inc();
                }
                tracing::warn!(upstream = %upstream.name, server = %server.name, %error, "tcp connect failed");
                if outcome == Outcome::Local {
                    return None;
                }
            }
        }
        if !upstream.retry.on.connect_error {
            return None;
        }
        pick = worker.upstreams.retry(index, plan, upstream, key, &tried)?;
        tried.push(pick.server);
        if let Some(m) = worker.metrics.upstream(plan.slot) {
            m.retries.inc();
        }
    }
}

/// Sends the listener's PROXY header (if any) to the server: the carried addresses when
/// the client's own header had them, else the client and the address it connected to.
/// False if the server connection failed.
async fn send_proxy_header(
    server: &TcpStream,
    listener: &Listener,
    local: impl FnOnce() -> SocketAddr,
    peer: SocketAddr,
    carried: Option<Addresses>,
) -> bool {
    let version = listener.proxy_protocol.send;
    if version == weir_config::ProxyVersion::Off {
        return true;
    }
    let addresses = match carried {
        Some(a) => a,
        None => Addresses {
            source: peer,
            destination: local(),
        },
    };
    let Some(header) = proxy_protocol::encode(version, addresses) else {
        return true;
    };
    io::write_bytes(server, header.as_bytes()).await.is_ok()
}
