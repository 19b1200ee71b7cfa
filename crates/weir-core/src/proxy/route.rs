//! The routing decision, made once for every client protocol: a [`Request`] (the HTTP/1.1
//! head every protocol presents, and who sent it) goes through [`Routing::decide`], which
//! says what happens to it: forward it to an upstream (a split already resolved), answer
//! it locally (an [`Answer`]), or refuse it with an error's status.
//!
//! Order: `max_body_size` (413), a pending ACME HTTP-01 token (before `redirect_https`:
//! validation comes on port 80), `redirect_https`, path normalisation (400), the router
//! (none: the default response), the rewrite check, the route's admission filters
//! (`policy`: 403, 429, 401; a password check the cache cannot answer is awaited off the
//! event loop, 503 when too many run), the route's target (`files`: a file's reply, or the
//! route's upstream when no file answers), then the route's cache (a fresh entry
//! answers, as a reply; `cache`).

use weir_config::{Listener, Redirect, Route, TemplatePart, Variable};

use crate::answer::{Answer, Refusal};
use crate::cache::{Fill, Lookup as CacheLookup};
use crate::codec::http1::BodyFraming;
use crate::error::ProxyError;
use crate::files::Lookup;
use crate::filters::basic_auth::{PendingCheck, Verdict};
use crate::filters::rewrite::check_join;
use crate::forward::Target;
use crate::policy::Admit;
use crate::request::Request;
use crate::router::{RequestView, RoutedPath};
use crate::snapshot::{ListenerPlan, RoutePlan, Snapshot};
use crate::tls::auto::challenge;
use crate::worker::Worker;

/// What happens to a request.
pub enum Decision<'a> {
    /// Forward it to this upstream (a split already resolved); with a cache miss's
    /// [`Fill`] when its response may be stored (a route with `cache`).
    Forward(Target<'a>, Option<Box<Fill>>),
    /// Weir answers it.
    Answer(Answer<'a>),
    /// A source that is not an upstream answers it: the route's files, or a fresh entry
    /// of its cache (boxed: the other decisions stay small).
    Reply(Box<crate::files::Reply>),
    /// Refused with this error's status.
    Refuse(ProxyError),
}

/// A decision, or (`Err`) the route whose password check must be awaited first.
pub type Decided<'a> = Result<Decision<'a>, (usize, Box<PendingCheck>)>;

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
    /// Returns the route taken, if any, and the decision, or (`Err`) the password check
    /// the route's `basic_auth` cache could not answer: the caller awaits
    /// [`Routing::verified`] then (boxed, so a request that needs no check keeps a small
    /// future and no await of its own: `decide` is not an `async fn`).
    pub fn decide(&self, r: &Request<'_>, path: &mut RoutedPath) -> (Option<usize>, Decided<'a>) {
        let listener = self.listener();
        let plan = &self.snapshot.listeners[self.listener];
        let raw_path = r.req.path(r.buf);
        if let Some(decision) = before_routing(r, raw_path, listener, plan) {
            // Not normalised: a `redirect_https` renders the path as sent (after the host,
            // so it cannot point elsewhere); not the last request's.
            path.forget();
            return (None, Ok(decision));
        }
        let routed = match path.normalize(raw_path, &listener.path_normalization) {
            Ok(routed) => routed,
            Err(error) => return (None, Ok(Decision::Refuse(error))),
        };
        let view = RequestView::new(r.buf, r.req);
        let Some(index) = plan.router.route(r.req.host_name(r.buf), routed, &view) else {
            let default = Answer::Default(plan.default_response());
            return (None, Ok(Decision::Answer(default)));
        };
        let route = Some(index);
        let config = &listener.routes[index];
        let rewrite = config.rewrite_prefix.as_deref();
        if let Err(error) = check_join(routed, &config.path_prefix, rewrite) {
            return (route, Ok(Decision::Refuse(error)));
        }
        let admission = crate::policy::Admission {
            worker: self.worker,
            snapshot: self.snapshot,
            listener: self.listener,
            route: index,
        };
        match admission.refusal(r) {
            Admit::Admitted => (route, Ok(self.admitted(r, path, index))),
            Admit::Refused(refusal) => (route, Ok(Decision::Answer(Answer::Refused(refusal)))),
            Admit::Verify(check) => (route, Err((index, check))),
        }
    }

    /// The decision for `r` once the password check `decide` left (`(index, check)`:
    /// on route `index`) ran off the event loop.
    pub async fn verified(
        &self,
        r: &Request<'_>,
        path: &RoutedPath,
        (index, check): (usize, Box<PendingCheck>),
    ) -> Decision<'a> {
        let auth = self.listener().routes[index].filters.basic_auth.as_ref();
        let limit = self.snapshot.config.server.password_checks;
        let refused = match check.run(&self.worker.auth_cache, limit).await {
            Verdict::Admitted => return self.admitted(r, path, index),
            Verdict::Refused => Refusal::Unauthorized(auth.map_or("", |a| &a.realm)),
            Verdict::Busy => Refusal::PasswordChecksBusy,
        };
        Decision::Answer(Answer::Refused(refused))
    }

    /// The decision for `r` on route `index`, its admission filters passed.
    #[inline]
    fn admitted(&self, r: &Request<'_>, path: &RoutedPath, index: usize) -> Decision<'a> {
        let plan = &self.snapshot.listeners[self.listener];
        let routed = path.get(r.req.path(r.buf));
        let config = &self.listener().routes[index];
        let upstream = match &plan.routes[index] {
            RoutePlan::Upstream(upstream) => *upstream,
            RoutePlan::Split(split) => {
                let slots = &self.snapshot.slots.listeners[self.listener];
                let route = slots.route(Some(index));
                let cursor = self.worker.splits.next(slots.slot, route);
                split.pick(cursor, &self.snapshot.upstreams)
            }
            RoutePlan::Respond(canned) => return Decision::Answer(Answer::Respond(canned)),
            RoutePlan::Redirect(redirect) => return redirect_to(r, redirect),
            RoutePlan::Files(files) => match files.lookup(self.worker, r, routed) {
                Lookup::Reply(reply) => return Decision::Reply(Box::new(reply)),
                Lookup::Upstream(upstream) => upstream,
            },
        };
        let fill = match &config.filters.cache {
            None => None,
            Some(cache) => match self.through_cache(r, routed, cache, index, upstream) {
                Ok(fill) => fill,
                Err(answered) => return answered,
            },
        };
        Decision::Forward(self.target(config, upstream), fill)
    }

    /// The route's `cache` for `r` (`routed`: its normalised path and query), before it
    /// goes to route `index`'s `upstream` (in the config's, a split already resolved): a
    /// fresh entry's reply, or a stale one's with its revalidation started in the
    /// background (`Err`); else the miss's fill, if its response may be stored. Out of
    /// line: a route without `cache` keeps `decide` small.
    #[inline(never)]
    fn through_cache(
        &self,
        r: &Request<'_>,
        routed: &[u8],
        cache: &weir_config::RouteCache,
        index: usize,
        upstream: usize,
    ) -> Result<Option<Box<Fill>>, Decision<'a>> {
        let store = &self.snapshot.caches[cache.store];
        let tls = self.snapshot.config.listeners[self.listener].tls.as_ref();
        let cert_header = tls.and_then(|t| t.client_cert_header.as_deref());
        match crate::cache::lookup(r, routed, cert_header, cache, store) {
            CacheLookup::Hit(reply) => Err(Decision::Reply(reply)),
            CacheLookup::Stale(reply, revalidation) => {
                if let Some(fill) = revalidation {
                    super::revalidate::start(self, r, index, upstream, fill);
                }
                Err(Decision::Reply(reply))
            }
            CacheLookup::Miss(fill) => Ok(Some(fill)),
            CacheLookup::Bypass => Ok(None),
        }
    }

    /// The trace of the request (`request` presents it only when asked), routed to
    /// `route`, if it is sampled (`otel::begin`; at once `None` without `[tracing]`).
    /// Asked after `decide`, for every decision.
    #[inline]
    pub fn trace<'r>(
        &self,
        route: Option<usize>,
        request: impl FnOnce() -> Request<'r>,
    ) -> Option<std::rc::Rc<crate::otel::RequestTrace>> {
        let tracer = self.snapshot.tracer.as_ref()?;
        let listener = self.listener();
        let route = route.map(|i| &listener.routes[i]);
        crate::otel::begin(tracer, listener, route, &request())
    }

    /// The route's upstream `upstream_index`, with its pool plan and the listener's limits.
    pub(crate) fn target(&self, route: &'a Route, upstream_index: usize) -> Target<'a> {
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

/// What the listener decides before any route (`raw_path`: the request's path as sent): a
/// body over `max_body_size` refused, an ACME HTTP-01 challenge answered, a plain-HTTP
/// request to a TLS listener's `http_bind` redirected. Inlined: it is every request's.
#[inline(always)]
fn before_routing<'a>(
    r: &Request<'_>,
    raw_path: &[u8],
    listener: &Listener,
    plan: &'a ListenerPlan,
) -> Option<Decision<'a>> {
    if let (BodyFraming::Length(n), Some(max)) = (r.req.framing, listener.max_body_size) {
        if n > max {
            return Some(Decision::Refuse(ProxyError::BodyTooLarge));
        }
    }
    // A prefix compare for every other path, a lock-free lookup for these.
    if raw_path.starts_with(challenge::HTTP01_PREFIX) {
        if let Some(key_authorization) = challenge::http01_answer(raw_path) {
            return Some(Decision::Answer(Answer::Acme(key_authorization)));
        }
    }
    // Only what came over plain HTTP: a TLS listener's `http_bind` connections.
    let redirect = plan.redirect_https.as_ref();
    let redirect = redirect.filter(|_| r.origin.tls.is_none())?;
    Some(redirect_to(r, redirect))
}

/// A redirect for `r`. One whose `to` names `{host}` needs a host to name: rendered empty,
/// `https://{host}{path}` would send `https:///evil.com/x`, which browsers read as a URL on
/// evil.com. An HTTP/1.0 request without `Host` (or with `Host: .`) gets 400 there, as an
/// HTTP/1.1 request without one does.
fn redirect_to<'a>(r: &Request<'_>, redirect: &'a Redirect) -> Decision<'a> {
    let names_host = redirect.to.0.contains(&TemplatePart::Var(Variable::Host));
    if names_host && r.req.host_name(r.buf).is_empty() {
        return Decision::Refuse(ProxyError::BadRequest(
            "a redirect needs the request's Host",
        ));
    }
    Decision::Answer(Answer::Redirect(redirect))
}
