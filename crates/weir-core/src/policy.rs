//! The traffic-policy steps of a request (issue 16) between routing and forwarding.
//!
//! `identify` runs once a head is read: the request id and, behind `trusted_proxies`, the
//! client address. `Admission::refusal` runs once a route is chosen (`proxy::route`):
//! access lists, the rate limit, then basic auth; a refused request gets Weir's own answer
//! (`answer`), which keeps the connection like any other answer. Each step is
//! skipped by one `Option` / emptiness check when its filter is not configured. A
//! shared rate limit (`cluster::shared_limit`) decides like a local one and notes what it
//! admitted in the worker's own counts for the next sync.

use std::net::IpAddr;

use weir_config::{Listener, RateKey, RateLimit};

use crate::answer::Refusal;
use crate::cluster::shared_limit::SharedCount;
use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;
use crate::filters::rate_limit::{ip_key, retry_after_secs, RateLimiter};
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

/// What admission says of a request.
pub enum Admit<'a> {
    Admitted,
    Refused(Refusal<'a>),
    /// Every filter passed but the password, which must be verified (`basic_auth`).
    Verify(Box<basic_auth::PendingCheck>),
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
    /// auth (its password verified later when the worker's cache does not know it).
    pub fn refusal(&self, r: &Request<'_>) -> Admit<'a> {
        let listener = &self.snapshot.config.listeners[self.listener];
        let filters = &listener.routes[self.route].filters;
        if let Some(access) = &filters.access {
            if !access.permits(r.origin.client_ip()) {
                return Admit::Refused(Refusal::Forbidden);
            }
        }
        if let Some(limit) = &filters.rate_limit {
            if let Some(refusal) = self.rate_check(limit, r) {
                return Admit::Refused(refusal);
            }
        }
        if let Some(auth) = &filters.basic_auth {
            use basic_auth::Check;
            match basic_auth::authorized(auth, &self.worker.auth_cache, r.buf, r.req) {
                Check::Admitted => {}
                Check::Refused => return Admit::Refused(Refusal::Unauthorized(&auth.realm)),
                Check::Verify(check) => return Admit::Verify(check),
            }
        }
        Admit::Admitted
    }

    /// Counts the request against the route's limiter; `Some`: refused (429 over the
    /// limit, 503 for a shared limit that denies while Redis is down).
    fn rate_check(&self, limit: &RateLimit, r: &Request<'_>) -> Option<Refusal<'a>> {
        let plan = &self.snapshot.listeners[self.listener];
        let Some(Some(limiter)) = plan.limiters.get(self.route) else {
            return None;
        };
        let now = r.started;
        let key = match &limit.key {
            RateKey::ClientIp => LimitKey::Ip(r.origin.client_ip()),
            RateKey::Route => LimitKey::Route,
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
                LimitKey::Bytes(value)
            }
        };
        let hash = match key {
            LimitKey::Ip(ip) => limiter.hash(ip),
            LimitKey::Route => limiter.hash(()),
            LimitKey::Bytes(value) => limiter.hash(value),
        };
        let checked = limiter.check_hash(hash, now);
        let refused = match &limiter.shared {
            None => checked.err().map(limited),
            Some(shared) => self.shared_outcome(limiter, shared, hash, key, checked),
        };
        if let Some(Refusal::RateLimited(_)) = refused {
            self.count_rate_limited(r.protocol);
        }
        refused
    }

    /// A shared limit's verdict: refused while Redis is down with `on_error = "deny"`,
    /// else the local one; the request is noted for the next sync either way (a refused
    /// one as seen with nothing admitted, so that the sync reads the fleet's count and
    /// finds Redis back).
    #[cold]
    #[inline(never)]
    fn shared_outcome(
        &self,
        limiter: &std::sync::Arc<RateLimiter>,
        shared: &SharedCount,
        hash: u64,
        key: LimitKey<'_>,
        checked: Result<(), std::time::Duration>,
    ) -> Option<Refusal<'a>> {
        let mut octets = [0u8; 16];
        let key = match key {
            LimitKey::Ip(ip) => {
                let len = ip_key(&ip, &mut octets);
                &octets[..len]
            }
            LimitKey::Route => &[][..],
            LimitKey::Bytes(value) => value,
        };
        let denied = shared.denies();
        let admitted = checked.is_ok() && !denied;
        self.worker.shared_counts.note(limiter, hash, key, admitted);
        if denied {
            return Some(Refusal::RateLimitUnavailable);
        }
        checked.err().map(limited)
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

/// What a rate limit counts a request by.
#[derive(Clone, Copy)]
enum LimitKey<'a> {
    Ip(IpAddr),
    Route,
    Bytes(&'a [u8]),
}

/// The refusal of a request over the limit: 429, `Retry-After` the wait in seconds.
fn limited<'a>(wait: std::time::Duration) -> Refusal<'a> {
    Refusal::RateLimited(retry_after_secs(wait))
}
