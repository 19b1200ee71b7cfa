//! The TLS handshake of an accepted connection, before its first request.
//!
//! Bounded twice, so a slow or garbage ClientHello never holds a worker: the whole
//! handshake must finish within `handshake_timeout`, and each worker runs at most
//! `max_handshakes` of a listener at once. At that cap a new connection is not turned
//! away: the handshake idle longest (no whole ClientHello since its accept, or nothing
//! since its ClientHello) gives up its place (`places`), so silent or stalled
//! connections cannot lock ready clients out. Bytes already read (the first read, or what
//! came with a PROXY header) are the start of the ClientHello and are fed to rustls first.
//! A first byte that is not a TLS handshake record ends the connection; text there is
//! plain HTTP sent to a TLS port. Every outcome is counted: by version when it succeeds,
//! by reason when it fails.

use std::io;
use std::time::Instant;

use rustls::server::Acceptor;
use rustls::{Error, PeerIncompatible};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::{LazyConfigAcceptor, StartHandshake, TlsStream};

use super::session::TlsSession;
use super::ListenerTls;
use crate::buffer::Buffer;
use crate::client_stream::ClientStream;
use crate::metrics::shard::TlsFailure;
use crate::places::Place;
use crate::worker::Worker;

/// The TLS record type of a handshake message: every ClientHello starts with it.
const HANDSHAKE_RECORD: u8 = 0x16;

/// How a handshake ended: a TLS stream, nothing (the client sent nothing, or it was an
/// ACME validation), or a failure.
type Outcome = Result<Option<TlsStream<TcpStream>>, TlsFailure>;

/// Runs the handshake on `stream` (a connection of listener `at`),
/// counts it, and on success makes `stream` a TLS stream. `None`: the connection must
/// close (the client left, or the handshake failed; counted and logged at debug).
pub async fn accept(
    worker: &Worker,
    at: crate::listener::Slot<'_>,
    tls: &ListenerTls,
    stream: &mut ClientStream,
    buf: &mut Buffer,
) -> Option<TlsSession> {
    let crate::listener::Slot { slot, listener } = at;
    let outcome = {
        let pending = worker
            .handshakes
            .enter(slot, tls.max_handshakes, Instant::now());
        let handshake =
            tokio::time::timeout(tls.handshake_timeout, handshake(tls, stream, buf, &pending));
        tokio::select! {
            // A handshake that finished in the same turn as its eviction keeps its result.
            biased;
            done = handshake => done.unwrap_or(Err(TlsFailure::Timeout)),
            () = pending.taken() => Err(TlsFailure::Evicted),
        }
    };
    let result = match outcome {
        Ok(Some(tls_stream))
            if tls_stream.get_ref().1.alpn_protocol()
                == Some(super::auto::challenge::ACME_TLS_ALPN) =>
        {
            // A TLS-ALPN-01 validation: the handshake was the answer (RFC 8737).
            Ok(None)
        }
        // Defence in depth: a resumed session brings back the certificate it was made
        // with, or none; whatever setup issued it, no certificate under a policy that
        // requires one is refused.
        Ok(Some(tls_stream))
            if tls.requires_client_cert()
                && tls_stream.get_ref().1.peer_certificates().is_none() =>
        {
            Err(TlsFailure::BadClientCert)
        }
        Ok(Some(tls_stream)) => {
            let session = TlsSession::new(tls_stream.get_ref().1, tls);
            stream.set_tls(tls_stream, listener.client_timeout);
            Ok(Some(session))
        }
        Ok(None) => Ok(None),
        Err(failure) => Err(failure),
    };
    count(worker, at, result)
}

/// Counts a handshake's result on the listener's metrics; the session if there is one.
fn count(
    worker: &Worker,
    at: crate::listener::Slot<'_>,
    result: Result<Option<TlsSession>, TlsFailure>,
) -> Option<TlsSession> {
    let crate::listener::Slot { slot, listener } = at;
    let metrics = worker.metrics.listener(slot);
    match result {
        Ok(Some(session)) => {
            if let (Some(m), Some(v)) = (metrics, session.version_index()) {
                m.tls_handshakes[2 * v + usize::from(session.resumed)].inc();
            }
            Some(session)
        }
        Ok(None) => None,
        Err(failure) => {
            if let Some(m) = metrics {
                m.tls_failures[failure as usize].inc();
            }
            tracing::debug!(listener = %listener.name, reason = failure.label(), "TLS handshake failed");
            None
        }
    }
}

/// The handshake itself. `Ok(None)`: the client closed before sending anything (a port
/// check, not a failed handshake). The whole ClientHello counts as a step forward for
/// `pending` (see `places`).
async fn handshake(
    tls: &ListenerTls,
    stream: &mut ClientStream,
    buf: &mut Buffer,
    pending: &Place<'_>,
) -> Outcome {
    if buf.is_empty() && !matches!(buf.read_from(stream).await, Ok(n) if n > 0) {
        return Ok(None);
    }
    match buf.filled()[0] {
        HANDSHAKE_RECORD => {}
        b if b.is_ascii_alphabetic() => return Err(TlsFailure::PlainHttp),
        _ => return Err(TlsFailure::Other),
    }
    let mut tcp = stream.take_registered().map_err(|_| TlsFailure::Other)?;
    let mut acceptor = Acceptor::default();
    let mut early = buf.filled();
    while !early.is_empty() {
        if acceptor.read_tls(&mut early).is_err() {
            return Err(TlsFailure::Other);
        }
    }
    buf.clear();
    // The bytes read may already hold the whole ClientHello: ask before reading more.
    let start = match acceptor.accept() {
        Ok(Some(accepted)) => StartHandshake::from_parts(accepted, tcp),
        Ok(None) => LazyConfigAcceptor::new(acceptor, tcp)
            .await
            .map_err(|e| classify(&e))?,
        Err((error, alert)) => {
            send_alert(&mut tcp, alert).await;
            return Err(classify_rustls(&error));
        }
    };
    pending.progressed();
    // The ACME validator's ClientHello (only `acme-tls/1`) gets the challenge config.
    let config = match &tls.challenge_config {
        Some(challenge)
            if start
                .client_hello()
                .alpn()
                .is_some_and(super::auto::challenge::is_challenge_hello) =>
        {
            challenge
        }
        _ => &tls.server_config,
    };
    let tls = start
        .into_stream(config.clone())
        .await
        .map_err(|e| classify(&e))?;
    Ok(Some(tls))
}

/// Tells the client why its ClientHello was refused (`illegal_parameter` for a bad server
/// name...), as tokio-rustls does when it reads the hello itself. A few bytes into an empty
/// socket buffer, within the handshake's time bound.
async fn send_alert(tcp: &mut TcpStream, mut alert: rustls::server::AcceptedAlert) {
    let mut bytes = Vec::new();
    while matches!(alert.write(&mut bytes), Ok(n) if n > 0) {}
    let _ = tcp.write_all(&bytes).await;
}

/// The failure reason of a handshake error from tokio-rustls.
fn classify(e: &io::Error) -> TlsFailure {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Error>())
        .map_or(TlsFailure::Other, classify_rustls)
}

fn classify_rustls(e: &Error) -> TlsFailure {
    use PeerIncompatible::*;
    match e {
        Error::PeerIncompatible(
            NoCipherSuitesInCommon
            | NoKxGroupsInCommon
            | NoSignatureSchemesInCommon
            | NoCertificateRequestSignatureSchemesInCommon,
        ) => TlsFailure::NoSharedCipher,
        Error::PeerIncompatible(
            SupportedVersionsExtensionRequired
            | Tls12NotOffered
            | Tls12NotOfferedOrEnabled
            | ServerDoesNotSupportTls12Or13,
        ) => TlsFailure::NoSharedVersion,
        Error::NoCertificatesPresented | Error::InvalidCertificate(_) => TlsFailure::BadClientCert,
        Error::PeerMisbehaved(rustls::PeerMisbehaved::ServerNameMustContainOneHostName)
        | Error::InvalidMessage(rustls::InvalidMessage::InvalidServerName) => TlsFailure::BadSni,
        _ => TlsFailure::Other,
    }
}
