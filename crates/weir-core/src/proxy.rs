//! THE pipeline: one client connection, request after request.
//!
//! ```text
//! accept (listener/) -> read request head (client.rs, codec/http1) -> route (router/)
//!   -> pick server (upstream/) -> connect or reuse (connector/) -> send head + stream body
//!   -> read response head -> response filters -> stream body back (forward/)
//!   -> keep-alive or close
//! ```
//! Errors become responses in exactly one place: `answer_error` at the bottom of the loop.

use std::net::SocketAddr;
use std::rc::Rc;

use tokio::net::TcpStream;
use weir_config::Listener;

use crate::client::{ClientConn, NextRequest};
use crate::codec::http1::{BodyFraming, RequestHead, ResponseHead};
use crate::error::ProxyError;
use crate::forward::body::BodyState;
use crate::forward::{forward, Failure};
use crate::snapshot::{ListenerPlan, Snapshot};
use crate::worker::Worker;

/// Serves one client connection until it closes.
pub async fn serve_client(
    worker: Rc<Worker>,
    listener_index: usize,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let snapshot = worker.snapshot();
    let mut conn = ClientConn::new(stream, peer, &snapshot.config.listeners[listener_index]);
    drop(snapshot);
    let mut req = RequestHead::default();
    let mut resp = ResponseHead::default();
    loop {
        let snapshot = worker.snapshot();
        let listener = &snapshot.config.listeners[listener_index];
        let outcome = match conn.next_request(listener, &mut req, &worker).await {
            Ok(NextRequest::Ready) => {
                conn.served += 1;
                handle(
                    &worker,
                    &snapshot,
                    listener_index,
                    &mut conn,
                    &req,
                    &mut resp,
                )
                .await
            }
            Ok(NextRequest::Close) => return,
            Err(error) => Err(Failure::from(error)),
        };
        match outcome {
            Ok(true) => continue,
            Ok(false) => return,
            Err(failure) => {
                log_failure(&failure.error, listener, &conn);
                if !failure.responded {
                    conn.answer_error(failure.error, listener).await;
                }
                return;
            }
        }
    }
}

/// One request: route it, then forward it or answer with the default response.
/// Returns whether the client connection stays open.
async fn handle(
    worker: &Worker,
    snapshot: &Snapshot,
    listener_index: usize,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
) -> Result<bool, Failure> {
    let listener = &snapshot.config.listeners[listener_index];
    let plan = &snapshot.listeners[listener_index];
    if let (BodyFraming::Length(n), Some(max)) = (req.framing, listener.max_body_size) {
        if n > max {
            return Err(ProxyError::BodyTooLarge.into());
        }
    }
    let keep_alive = wants_keep_alive(req, listener, conn.served, worker.is_draining());
    let buf = conn.buf.filled();
    let route = plan
        .router
        .route(req.host_name(buf), &buf[req.path.clone()]);
    let Some(route) = route.map(|i| &listener.routes[i]) else {
        return default_response(listener, plan, conn, req, keep_alive).await;
    };
    let upstream = &snapshot.config.upstreams[route.upstream];
    let target = crate::forward::exchange_target(listener, route, upstream);
    forward(worker, target, conn, req, resp, keep_alive).await
}

/// Whether the client connection may carry another request after this one.
fn wants_keep_alive(req: &RequestHead, listener: &Listener, served: u64, draining: bool) -> bool {
    let asked = if req.minor_version == 0 {
        req.connection.keep_alive && !req.connection.close
    } else {
        !req.connection.close
    };
    let under_limit = listener.keepalive_requests == 0 || served < listener.keepalive_requests;
    asked && under_limit && !draining && !listener.keepalive_timeout.is_zero()
}

/// Seed 002's default backend: the listener's configured response for unrouted requests.
/// A request body already in the buffer is skipped; one still arriving closes the connection.
async fn default_response(
    listener: &Listener,
    plan: &ListenerPlan,
    conn: &mut ClientConn,
    req: &RequestHead,
    keep_alive: bool,
) -> Result<bool, Failure> {
    conn.buf.consume(req.head_len);
    let mut body = BodyState::new(req.framing, false, listener.max_body_size);
    let (_, consumed) = body
        .take(conn.buf.filled_mut())
        .map_err(|_| ProxyError::BadRequest("malformed body"))?;
    conn.buf.consume(consumed);
    let keep_alive = keep_alive && body.is_done();
    let bytes = if keep_alive {
        &plan.default_keep_alive
    } else {
        &plan.default_close
    };
    conn.write_all(bytes, listener).await.map_err(|e| Failure {
        error: e,
        responded: true,
    })?;
    Ok(keep_alive)
}

fn log_failure(error: &ProxyError, listener: &Listener, conn: &ClientConn) {
    match error.side() {
        crate::error::Side::Client => {
            let client = String::from_utf8_lossy(conn.ip.as_bytes());
            tracing::debug!(listener = %listener.name, %client, %error, "client error")
        }
        _ => tracing::warn!(listener = %listener.name, %error, "request failed"),
    }
}
