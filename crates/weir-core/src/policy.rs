//! The traffic-policy steps of a request (issue 16) between routing and forwarding.
//!
//! `identify` runs once a head is read: the request id and, behind `trusted_proxies`, the
//! client address. `Admission::refusal` runs once a route is chosen (`proxy::route`):
//! access lists, the rate limit, then basic auth; a refused request gets Weir's own answer
//! (`answer`), which keeps the connection like any other answer. Each step is
//! skipped by one `Option` / emptiness check when its filter is not configured.

use std::net::IpAddr;

use weir_config::{Listener, RateKey, RateLimit};

use crate::answer::Refusal;
use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;
use crate::filters::rate_limit::retry_after_secs;
use crate::filters::request_id::RequestId;
use crate::filters::{basic_auth, real_ip, request_id};
use crate::metrics::shard::Protocol;
use crate::request::Request;
use crate::snapshot::Snapshot;
use crate::worker::Worker;

/// Sets the request's id (cleared when the listener has none) and returns its client
/// behind trusted proxies, if the peer (`peer`) is one; for every client protocol.
pub fn identify(
    worker: &Worker,
    listener: &Listener,
    buf: &[u8],
    req: &RequestHead,
    peer: IpAddr,
    id: &mut RequestId,
) -> Option<(IpAddr, ClientIp)> {
    match &listener.policy.request_id {
        Some(settings) => request_id::assign(id, &worker.request_ids, settings, buf, req),
        None => id.clear(),
    }
    let trusted = &listener.policy.trusted_proxies;
    if trusted.is_empty() {
        return None;
    }
    real_ip::client_behind(peer, trusted, buf, &req.headers).map(|ip| (ip, ClientIp::new(ip)))
}

/// A request's route: what admission needs beyond the request.
pub struct Admission<'a> {
    pub worker: &'a Worker,
    pub snapshot: &'a Snapshot,
    /// Config positions of the listener and the route in `snapshot`.
    pub listener: usize,
    pub route: usize,
}

impl<'a> Admission<'a> {
    /// The route's admission filters, in order: access lists, the rate limit (before the
    /// costly password check, as nginx's limit_req runs before auth_basic), then basic
    /// auth. `Some`: refused; `None`: admitted.
    pub fn refusal(&self, r: &Request<'_>) -> Option<Refusal<'a>> {
        let listener = &self.snapshot.config.listeners[self.listener];
        let filters = &listener.routes[self.route].filters;
        if let Some(access) = &filters.access {
            if !access.permits(r.origin.client_ip()) {
                return Some(Refusal::Forbidden);
            }
        }
        if let Some(limit) = &filters.rate_limit {
            if let Err(wait) = self.rate_check(limit, r) {
                return Some(Refusal::RateLimited(retry_after_secs(wait)));
            }
        }
        if let Some(auth) = &filters.basic_auth {
            if !basic_auth::authorized(auth, &self.worker.auth_cache, r.buf, r.req) {
                return Some(Refusal::Unauthorized(&auth.realm));
            }
        }
        None
    }

    /// Counts the request against the route's limiter; `Err`: refused, with the wait.
    fn rate_check(&self, limit: &RateLimit, r: &Request<'_>) -> Result<(), std::time::Duration> {
        let plan = &self.snapshot.listeners[self.listener];
        let Some(Some(limiter)) = plan.limiters.get(self.route) else {
            return Ok(());
        };
        let now = r.started;
        let checked = match &limit.key {
            RateKey::ClientIp => limiter.check(r.origin.client_ip(), now),
            RateKey::Route => limiter.check((), now),
            RateKey::Header(name) => {
                let buf = r.buf;
                let value = r
                    .req
                    .headers
                    .iter()
                    .find(|h| {
                        h.name.len() == name.len()
                            && buf[h.name.clone()].eq_ignore_ascii_case(name.as_bytes())
                    })
                    .map_or(&[][..], |h| &buf[h.value.clone()]);
                limiter.check(value, now)
            }
        };
        if checked.is_err() {
            self.count_rate_limited(r.protocol);
        }
        checked
    }

    fn count_rate_limited(&self, protocol: Protocol) {
        let Some(slots) = self.snapshot.slots.listeners.get(self.listener) else {
            return;
        };
        let metrics = self.worker.metrics.listener(slots.slot);
        if let Some(route) = metrics.and_then(|m| m.route(slots.route(Some(self.route)))) {
            route.rate_limited(protocol).inc();
        }
    }
}
