//! The traffic-policy steps of a request (issue 16) between routing and forwarding.
//!
//! `identify` runs once a head is read: the request id and, behind `trusted_proxies`, the
//! client address. `admit` runs once a route is chosen: access lists, then (when
//! configured) the route's other admission filters; a refused request is answered here
//! with Weir's own response, which keeps the connection like any other answer. Each step
//! is skipped by one `Option` / emptiness check when its filter is not configured.

use weir_config::{Listener, Route};

use crate::client::ClientConn;
use crate::codec::http1::write::{push_simple_response_with, Persistence};
use crate::codec::http1::{RequestHead, ResponseHead};
use crate::filters::forwarded::ClientIp;
use crate::filters::{real_ip, request_id};
use crate::forward::Failure;
use crate::worker::Worker;

/// Sets the request's id and its client address (after trusted proxies).
pub fn identify(worker: &Worker, listener: &Listener, conn: &mut ClientConn, req: &RequestHead) {
    let buf = conn.buf.filled();
    match &listener.policy.request_id {
        Some(id) => request_id::assign(&mut conn.request_id, &worker.request_ids, id, buf, req),
        None => conn.request_id.clear(),
    }
    let trusted = &listener.policy.trusted_proxies;
    conn.real_client = if trusted.is_empty() {
        None
    } else {
        real_ip::client_behind(conn.peer_ip, trusted, buf, &req.headers)
            .map(|ip| (ip, ClientIp::new(ip)))
    };
}

/// Runs the route's admission filters. `Some`: the request was refused and answered (its
/// status is in `resp.status`); `None`: forward it.
pub async fn admit(
    listener: &Listener,
    route: &Route,
    conn: &mut ClientConn,
    req: &RequestHead,
    resp: &mut ResponseHead,
    keep_alive: bool,
) -> Option<Result<bool, Failure>> {
    let filters = &route.filters;
    if let Some(access) = &filters.access {
        if !access.permits(conn.client_ip()) {
            let answer = Answer {
                status: 403,
                headers: b"",
            };
            return Some(answer.send(listener, conn, req, resp, keep_alive).await);
        }
    }
    None
}

/// A response Weir generates for a refused request.
struct Answer<'a> {
    status: u16,
    /// Extra header lines, each ending in CRLF.
    headers: &'a [u8],
}

impl Answer<'_> {
    /// Skips the request body (a body still arriving closes the connection afterwards),
    /// then writes the answer with the connection's persistence.
    async fn send(
        &self,
        listener: &Listener,
        conn: &mut ClientConn,
        req: &RequestHead,
        resp: &mut ResponseHead,
        keep_alive: bool,
    ) -> Result<bool, Failure> {
        resp.status = self.status;
        let keep_alive = conn.skip_body(req, listener)? && keep_alive;
        let persistence = Persistence::of(keep_alive, req.minor_version == 0);
        let mut out = std::mem::take(&mut conn.out);
        out.clear();
        let reason = crate::error::reason_phrase(self.status);
        let mut body = [0u8; 64];
        let len = reason.len().min(63);
        body[..len].copy_from_slice(&reason.as_bytes()[..len]);
        body[len] = b'\n';
        let body = &body[..=len];
        push_simple_response_with(
            &mut out,
            self.status,
            self.headers,
            "text/plain",
            body,
            persistence,
        );
        if req.is_head {
            out.truncate(out.len() - body.len());
        }
        let written = conn.write_all(&out, listener).await;
        conn.out = out;
        written.map_err(|error| Failure {
            error,
            responded: true,
        })?;
        Ok(keep_alive)
    }
}
