//! The traffic-policy steps of a request (issue 16) between routing and forwarding.
//!
//! `identify` runs once a head is read: the request id and, behind `trusted_proxies`, the
//! client address. `Routed::admit` runs once a route is chosen: access lists, the rate
//! limit, then basic auth; a refused request is answered here
//! with Weir's own response, which keeps the connection like any other answer. Each step
//! is skipped by one `Option` / emptiness check when its filter is not configured.

use weir_config::{Listener, RateKey, RateLimit};

use crate::client::ClientConn;
use crate::codec::http1::write::{push_simple_response_with, Persistence};
use crate::codec::http1::{RequestHead, ResponseHead};
use crate::filters::forwarded::ClientIp;
use crate::filters::rate_limit::retry_after_secs;
use crate::filters::{basic_auth, real_ip, request_id};
use crate::forward::Failure;
use crate::metrics::shard::Protocol;
use crate::snapshot::Snapshot;
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

/// Where a request stands once routed: what admission needs beyond the connection.
pub struct Routed<'a> {
    pub worker: &'a Worker,
    pub snapshot: &'a Snapshot,
    /// Config positions of the listener and the route in `snapshot`.
    pub listener: usize,
    pub route: usize,
}

/// What admission looks at in a request: who sent it and its head.
pub struct Asker<'a> {
    /// The client (behind trusted proxies when there are some).
    pub client: std::net::IpAddr,
    /// The head `req` was parsed from.
    pub buf: &'a [u8],
    pub req: &'a RequestHead,
    /// When the head was complete (the rate limiter's clock).
    pub now: std::time::Instant,
    /// The client's protocol (the `protocol` label of a refusal's count).
    pub protocol: Protocol,
}

impl Routed<'_> {
    /// Runs the route's admission filters for an HTTP/1 request and answers a refusal on
    /// `conn`. `Some`: the request was refused and answered (its status is in
    /// `resp.status`); `None`: forward.
    pub async fn admit(
        &self,
        conn: &mut ClientConn,
        req: &RequestHead,
        resp: &mut ResponseHead,
        keep_alive: bool,
    ) -> Option<Result<bool, Failure>> {
        let listener = &self.snapshot.config.listeners[self.listener];
        // Extra header lines go in the response-rules scratch (unused: no forwarding).
        let mut extra = std::mem::take(&mut conn.resp_lines);
        extra.clear();
        let asker = Asker {
            client: conn.client_ip(),
            buf: conn.buf.filled(),
            req,
            now: conn.request_started,
            protocol: Protocol::Http1,
        };
        let refused = self.refusal(&asker, &mut extra);
        let sent = match refused {
            Some(status) => {
                let answer = Answer {
                    status,
                    headers: &extra,
                };
                Some(answer.send(listener, conn, req, resp, keep_alive).await)
            }
            None => None,
        };
        conn.resp_lines = extra;
        sent
    }

    /// The route's admission filters, in order: access lists, the rate limit (before the
    /// costly password check, as nginx's limit_req runs before auth_basic), then basic
    /// auth. `Some(status)`: refused, with extra header lines of the answer appended to
    /// `extra`; `None`: admitted. Shared by HTTP/1 and HTTP/2.
    pub fn refusal(&self, asker: &Asker<'_>, extra: &mut Vec<u8>) -> Option<u16> {
        let listener = &self.snapshot.config.listeners[self.listener];
        let filters = &listener.routes[self.route].filters;
        if let Some(access) = &filters.access {
            if !access.permits(asker.client) {
                return Some(403);
            }
        }
        if let Some(limit) = &filters.rate_limit {
            if let Err(wait) = self.rate_check(limit, asker) {
                let mut line = RetryAfter::default();
                extra.extend_from_slice(line.render(retry_after_secs(wait)));
                return Some(429);
            }
        }
        if let Some(auth) = &filters.basic_auth {
            if !basic_auth::authorized(auth, &self.worker.auth_cache, asker.buf, asker.req) {
                extra.extend_from_slice(b"WWW-Authenticate: Basic realm=\"");
                extra.extend_from_slice(auth.realm.as_bytes());
                extra.extend_from_slice(b"\", charset=\"UTF-8\"\r\n");
                return Some(401);
            }
        }
        None
    }

    /// Counts the request against the route's limiter; `Err`: refused, with the wait.
    fn rate_check(&self, limit: &RateLimit, asker: &Asker<'_>) -> Result<(), std::time::Duration> {
        let plan = &self.snapshot.listeners[self.listener];
        let Some(Some(limiter)) = plan.limiters.get(self.route) else {
            return Ok(());
        };
        let now = asker.now;
        let checked = match &limit.key {
            RateKey::ClientIp => limiter.check(asker.client, now),
            RateKey::Route => limiter.check((), now),
            RateKey::Header(name) => {
                let buf = asker.buf;
                let value = asker
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
            self.count_rate_limited(asker.protocol);
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

/// A `Retry-After: N` header line, rendered on the stack.
struct RetryAfter {
    bytes: [u8; 40],
}

impl Default for RetryAfter {
    fn default() -> RetryAfter {
        RetryAfter { bytes: [0; 40] }
    }
}

impl RetryAfter {
    fn render(&mut self, secs: u64) -> &[u8] {
        const NAME: &[u8] = b"Retry-After: ";
        self.bytes[..NAME.len()].copy_from_slice(NAME);
        let len = crate::codec::http1::write::decimal_len(secs);
        let mut n = secs;
        for i in (0..len).rev() {
            self.bytes[NAME.len() + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let end = NAME.len() + len;
        self.bytes[end..end + 2].copy_from_slice(b"\r\n");
        &self.bytes[..end + 2]
    }
}

/// A response Weir generates for a refused request.
pub struct Answer<'a> {
    pub status: u16,
    /// Extra header lines, each ending in CRLF.
    pub headers: &'a [u8],
}

impl Answer<'_> {
    /// Appends the whole answer (its body: the reason phrase) to `out`; returns the body's
    /// length.
    pub fn render(&self, out: &mut Vec<u8>, persistence: Persistence) -> usize {
        let reason = crate::error::reason_phrase(self.status);
        let mut body = [0u8; 64];
        let len = reason.len().min(63);
        body[..len].copy_from_slice(&reason.as_bytes()[..len]);
        body[len] = b'\n';
        let body = &body[..=len];
        push_simple_response_with(
            out,
            self.status,
            self.headers,
            "text/plain",
            body,
            persistence,
        );
        body.len()
    }

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
        let body_len = self.render(&mut out, persistence);
        if req.is_head {
            out.truncate(out.len() - body_len);
        }
        let written = conn.write_all(&out, listener).await;
        conn.out = out;
        written.map_err(Failure::after_head)?;
        Ok(keep_alive)
    }
}
