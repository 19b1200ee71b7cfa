//! One QUIC connection speaking HTTP/3: the handshake (within the listener's
//! `handshake_timeout`), the h3 server with the listener's `max_field_section_size`, a
//! task per request stream, and the graceful close on drain (GOAWAY, then the streams in
//! flight finish). The connection counts among its listener's connections (drain,
//! `max_connections`) for as long as it lives.

use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h3::server::RequestResolver;

use crate::filters::forwarded::ClientIp;
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
}

/// The limits a connection is set up with, from its listener.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub max_field_section_size: u64,
}

/// Serves the connection `connecting` (a handshake under way) until it closes.
pub(super) async fn serve(
    guard: ConnectionGuard,
    (worker, slot): (Rc<Worker>, usize),
    connecting: quinn::Connecting,
    tls: Arc<ListenerTls>,
    limits: Limits,
) {
    let connection = match crate::time::with_timeout(limits.handshake_timeout, connecting).await {
        Ok(Ok(connection)) => connection,
        _ => return,
    };
    let sni = connection
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(String::into_boxed_str);
    let peer = connection.peer_identity().and_then(|p| {
        p.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()
    });
    let peer_ip = connection.remote_address().ip().to_canonical();
    let conn = Rc::new(Conn {
        worker: worker.clone(),
        slot,
        ip: ClientIp::new(peer_ip),
        peer_ip,
        tls: TlsSession::quic(sni, peer.as_deref().map(|c| &c[..]), &tls),
    });
    drop(tls);
    let built = h3::server::builder()
        .max_field_section_size(limits.max_field_section_size)
        .build::<_, Bytes>(h3_quinn::Connection::new(connection))
        .await;
    let Ok(mut h3) = built else {
        return;
    };
    let drained = worker.drained();
    tokio::pin!(drained);
    let mut closing = false;
    loop {
        tokio::select! {
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    let stream = request(conn.clone(), resolver, limits.header_timeout);
                    tokio::task::spawn_local(stream);
                }
                // Closed (after GOAWAY once the last stream ended), idle, or failed.
                _ => break,
            },
            () = &mut drained, if !closing => {
                closing = true;
                // GOAWAY: no new streams; those in flight finish, then `accept` ends.
                let _ = h3.shutdown(0).await;
            }
        }
    }
    drop(guard);
}

/// Reads a stream's request head (within `header_timeout`) and serves it.
async fn request(
    conn: Rc<Conn>,
    resolver: RequestResolver<h3_quinn::Connection, Bytes>,
    header_timeout: Duration,
) {
    let resolved = crate::time::with_timeout(header_timeout, resolver.resolve_request()).await;
    let Ok(Ok((request, stream))) = resolved else {
        return;
    };
    let (send, recv) = stream.split();
    super::stream::serve(conn, (request, send, recv)).await;
}
