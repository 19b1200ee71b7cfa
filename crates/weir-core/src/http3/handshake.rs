//! A QUIC connection's handshake: within the listener's `handshake_timeout`, in one of its
//! worker's `max_handshakes` places (shared with TLS over TCP, `tls::handshake`), counted
//! by how it ended. With `early_data` (0-RTT) the connection is served while its handshake
//! goes on, so that a resuming client's requests sent in 0-RTT are answered at once; each
//! request whose head is read before the handshake completes is early data
//! ([`Confirmation::in_early_data`]) and takes the rule of `tls::early_data`.

use std::cell::Cell;
use std::future::Future;
use std::time::Instant;

use quinn::ZeroRttAccepted;

use super::conn::Limits;
use crate::worker::Worker;

/// Starts the handshake of `connecting` (a connection of listener slot `slot`): waits for
/// it to complete, or with `early_data` returns the connection at once with the
/// handshake's end to [`watch`]. `None`: it failed (the connection is closed).
pub(super) async fn start(
    worker: &Worker,
    slot: usize,
    mut connecting: quinn::Connecting,
    limits: Limits,
) -> Option<(quinn::Connection, Option<ZeroRttAccepted>)> {
    if limits.early_data {
        // The whole ClientHello first: it may span several Initial packets (a post-quantum
        // key share, X25519MLKEM768, does), and until it is in there is no SNI for the
        // connection's forwarded headers and log (`handshake_data` would be `None`).
        let hello =
            crate::time::with_timeout(limits.handshake_timeout, connecting.handshake_data());
        let metrics = worker.metrics.listener(slot).map(|m| &m.http3);
        let failed = match hello.await {
            Ok(Ok(_)) => None,
            Ok(Err(_)) => Some(metrics.map(|m| &m.handshake_failures)),
            Err(_) => Some(metrics.map(|m| &m.handshake_timeouts)),
        };
        if let Some(counter) = failed {
            if let Some(c) = counter {
                c.inc();
            }
            // Dropping `connecting` closes the connection.
            return None;
        }
        // A server's conversion always succeeds (quinn: 0.5-RTT).
        match connecting.into_0rtt() {
            Ok((connection, accepted)) => return Some((connection, Some(accepted))),
            Err(back) => connecting = back,
        }
    }
    let done = async { connecting.await.ok() };
    bounded(worker, slot, done, limits).await.map(|c| (c, None))
}

/// Watches the handshake of `connection`, served during it (0-RTT), as [`start`] waits for
/// the others': closes the connection when it fails, times out or is evicted.
pub(super) async fn watch(
    worker: &Worker,
    slot: usize,
    connection: &quinn::Connection,
    accepted: ZeroRttAccepted,
    limits: Limits,
) {
    // `accepted` ends when the handshake completes or the connection fails (its `bool`
    // says whether 0-RTT was used, not which).
    let done = async {
        accepted.await;
        completed(connection).then_some(())
    };
    if bounded(worker, slot, done, limits).await.is_none() {
        connection.close(H3_NO_ERROR.into(), b"handshake failed");
    }
}

/// HTTP/3's NO_ERROR (RFC 9114 8.1): the connection closes on purpose (REQUEST_REJECTED
/// is a stream error code, not a connection's).
const H3_NO_ERROR: u32 = 0x100;

/// Waits for `done` (a handshake's end: `None`, it failed) within `handshake_timeout`, in
/// one of the worker's handshake places, as a TLS handshake over TCP does
/// (`tls::handshake`): at the listener's `max_handshakes` the handshake idle longest gives
/// its place to a newcomer, so Initials that never finish (spoofed sources, below
/// `retry_threshold`) hold a connection permit only until newer ones come. Counts how it
/// ended. Dropping `done` unfinished (a timeout, an eviction) closes a connection still
/// in its handshake; a 0-RTT one is closed by [`watch`].
async fn bounded<T>(
    worker: &Worker,
    slot: usize,
    done: impl Future<Output = Option<T>>,
    limits: Limits,
) -> Option<T> {
    let metrics = worker.metrics.listener(slot).map(|m| &m.http3);
    let pending = worker
        .handshakes
        .enter(slot, limits.max_handshakes, Instant::now());
    let handshake = crate::time::with_timeout(limits.handshake_timeout, done);
    let (connection, counter) = tokio::select! {
        // A handshake that finished in the same turn as its eviction keeps its result.
        biased;
        done = handshake => match done {
            Ok(Some(connection)) => (Some(connection), metrics.map(|m| &m.handshakes)),
            Ok(None) => (None, metrics.map(|m| &m.handshake_failures)),
            Err(_) => (None, metrics.map(|m| &m.handshake_timeouts)),
        },
        () = pending.taken() => (None, metrics.map(|m| &m.handshake_evictions)),
    };
    if let Some(c) = counter {
        c.inc();
    }
    connection
}

/// Whether a connection's handshake is still under way: its requests then are early data.
pub(super) struct Confirmation(Cell<Option<quinn::Connection>>);

impl Confirmation {
    /// `handshaking`: the connection, when it is served during its handshake (0-RTT).
    pub fn new(handshaking: Option<quinn::Connection>) -> Confirmation {
        Confirmation(Cell::new(handshaking))
    }

    /// Whether a request arriving now is early data: exact, with no wait ([`completed`]).
    /// Free once it said no (and for connections not served during their handshake).
    pub fn in_early_data(&self) -> bool {
        let Some(connection) = self.0.take() else {
            return false;
        };
        let confirmed = completed(&connection);
        if !confirmed {
            self.0.set(Some(connection));
        }
        !confirmed
    }
}

/// Whether the handshake of `connection` has completed, now: rustls exports keying
/// material only once it has processed the client's Finished (which quinn does before it
/// delivers any stream data that came after it).
fn completed(connection: &quinn::Connection) -> bool {
    let mut probe = [0u8; 1];
    let label = b"EXPORTER-weir-handshake-done";
    connection
        .export_keying_material(&mut probe, label, b"")
        .is_ok()
}
