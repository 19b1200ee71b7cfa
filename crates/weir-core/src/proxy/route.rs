//! The routing decision, made once for every client protocol: a [`Request`] (the HTTP/1.1
//! head every protocol presents, and who sent it) goes through [`Routing::decide`], which
//! says what happens to it: forward it to an upstream (a split already resolved), answer
//! it locally (an [`Answer`]), or refuse it with an error's status.
//!
//! Order: `max_body_size` (413), a pending ACME HTTP-01 token (before `redirect_https`:
//! validation comes on port 80), `redirect_https`, path normalisation (400), the router
//! (none: the default response), the rewrite check, the route's admission filters
//! (`policy`: 403, 429, 401), then the route's target.

use std::net::IpAddr;
use std::time::Instant;

use weir_config::{Listener, Route};

use super::answer::Answer;
use crate::codec::http1::{BodyFraming, RequestHead};
use crate::error::ProxyError;
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::filters::rewrite::check_join;
use crate::forward::Target;
use crate::metrics::shard::Protocol;
use crate::router::{RequestView, RoutedPath};
use crate::snapshot::{RoutePlan, Snapshot};
use crate::tls::auto::challenge;
use crate::tls::session::TlsSession;
use crate::worker::Worker;

/// Who sent a request, as every client protocol knows it.
#[derive(Clone, Copy)]
pub struct Origin<'a> {
    /// The peer (after a PROXY header): what `X-Forwarded-For` gets.
    pub peer: &'a ClientIp,
    pub peer_ip: IpAddr,
    /// The client behind `trusted_proxies`, when it is not the peer.
    pub behind: Option<(IpAddr, &'a ClientIp)>,
    /// The connection's TLS session (`None`: cleartext).
    pub tls: Option<&'a TlsSession>,
    /// The request's id (empty: none).
    pub request_id: &'a [u8],
}

impl Origin<'_> {
    /// The client: behind trusted proxies, else the peer (access lists, rate keys,
    /// `X-Real-IP`, `{client_ip}`, the `client_ip` hash key, the access log).
    pub fn client_ip(&self) -> IpAddr {
        self.behind.map_or(self.peer_ip, |(ip, _)| ip)
    }

    pub fn client_text(&self) -> &ClientIp {
        self.behind.map_or(self.peer, |(_, text)| text)
    }

    pub fn scheme(&self) -> &'static [u8] {
        match self.tls {
            Some(_) => b"https",
            None => b"http",
        }
    }
}

/// A request as every client protocol presents it: its HTTP/1.1 head (`buf`, parsed into
/// `req`; an HTTP/2 stream's is written from its fields) and who sent it.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub buf: &'a [u8],
    pub req: &'a RequestHead,
    pub origin: Origin<'a>,
    /// When the head was complete (the rate limiter's clock, the first attempt's start).
    pub started: Instant,
    pub protocol: Protocol,
}

impl Request<'_> {
    /// What `{variable}`s in a redirect's `to` expand to: `{host}` without its port.
    pub fn redirect_vars(&self) -> Vars<'_> {
        Vars {
            host: self.req.host_name(self.buf),
            ..self.vars()
        }
    }

    /// What `{variable}`s in header rules expand to (`{host}` as the client sent it).
    pub fn vars(&self) -> Vars<'_> {
        Vars {
            scheme: self.origin.scheme(),
            host: (self.req.host.as_ref()).map_or(&[][..], |r| &self.buf[r.clone()]),
            target: self.req.path(self.buf),
            client_ip: self.origin.client_text().as_bytes(),
            request_id: self.origin.request_id,
        }
    }
}

/// What happens to a request.
pub enum Decision<'a> {
    /// Forward it to this upstream (a split already resolved).
    Forward(Target<'a>),
    /// Weir answers it.
    Answer(Answer<'a>),
    /// Refused with this error's status.
    Refuse(ProxyError),
}

/// The snapshot and listener a request is routed in.
pub struct Routing<'a> {
    pub worker: &'a Worker,
    pub snapshot: &'a Snapshot,
    /// The listener's config position in `snapshot`.
    pub listener: usize,
}

impl<'a> Routing<'a> {
    pub fn listener(&self) -> &'a Listener {
        &self.snapshot.config.listeners[self.listener]
    }

    /// Routes `r` (its path normalised into `path`, which the head writers read later).
    /// Returns the route taken, if any, and the decision.
    pub fn decide(&self, r: &Request<'_>, path: &mut RoutedPath) -> (Option<usize>, Decision<'a>) {
        let listener = self.listener();
        let plan = &self.snapshot.listeners[self.listener];
        if let (BodyFraming::Length(n), Some(max)) = (r.req.framing, listener.max_body_size) {
            if n > max {
                return (None, Decision::Refuse(ProxyError::BodyTooLarge));
            }
        }
        // A prefix compare for every other path, a lock-free lookup for these.
        let raw_path = r.req.path(r.buf);
        if raw_path.starts_with(challenge::HTTP01_PREFIX) {
            if let Some(key_authorization) = challenge::http01_answer(raw_path) {
                return (None, Decision::Answer(Answer::Acme(key_authorization)));
            }
        }
        // Only what came over plain HTTP: a TLS listener's `http_bind` connections.
        if let Some(redirect) = plan.redirect_https.as_ref().filter(|_| r.origin.tls.is_none()) {
            return (None, Decision::Answer(Answer::Redirect(redirect)));
        }
        let routed = match path.normalize(raw_path, &listener.path_normalization) {
            Ok(routed) => routed,
            Err(error) => return (None, Decision::Refuse(error)),
        };
        let view = RequestView::new(r.buf, r.req);
        let Some(index) = plan.router.route(r.req.host_name(r.buf), routed, &view) else {
            return (
                None,
                Decision::Answer(Answer::Default(plan.default_response())),
            );
        };
        let route = Some(index);
        let config = &listener.routes[index];
        let rewrite = config.rewrite_prefix.as_deref();
        if let Err(error) = check_join(routed, &config.path_prefix, rewrite) {
            return (route, Decision::Refuse(error));
        }
        let admission = crate::policy::Admission {
            worker: self.worker,
            snapshot: self.snapshot,
            listener: self.listener,
            route: index,
        };
        if let Some(refusal) = admission.refusal(r) {
            return (route, Decision::Answer(Answer::Refused(refusal)));
        }
        let upstream = match &plan.routes[index] {
            RoutePlan::Upstream(upstream) => *upstream,
            RoutePlan::Split(split) => {
                let slots = &self.snapshot.slots.listeners[self.listener];
                let cursor = self.worker.splits.next(slots.slot, slots.route(route));
                split.pick(cursor, &self.snapshot.upstreams)
            }
            RoutePlan::Respond(canned) => {
                return (route, Decision::Answer(Answer::Respond(canned)))
            }
            RoutePlan::Redirect(redirect) => {
                return (route, Decision::Answer(Answer::Redirect(redirect)))
            }
        };
        (route, Decision::Forward(self.target(config, upstream)))
    }

    /// The route's upstream `upstream_index`, with its pool plan and the listener's limits.
    fn target(&self, route: &'a Route, upstream_index: usize) -> Target<'a> {
        let slots = self.snapshot.slots.listeners.get(self.listener);
        Target {
            listener: self.listener(),
            listener_slot: slots.map_or(usize::MAX, |s| s.slot),
            route,
            upstream: &self.snapshot.config.upstreams[upstream_index],
            upstream_index,
            pool: &self.snapshot.upstreams[upstream_index],
        }
    }
}
