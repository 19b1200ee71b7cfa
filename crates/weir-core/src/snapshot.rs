//! The immutable, pre-computed form of a validated config that workers read.
//!
//! A snapshot is built once per config change and published through `ArcSwap`; a request
//! sees exactly one snapshot from start to end. Anything derivable from the config that the
//! request path would otherwise recompute (route tables, pre-rendered default responses)
//! lives here.

use std::sync::Arc;

use weir_config::{Cluster, Config, Listener, UpstreamServer};

use weir_config::{Redirect, Route, RouteTarget};

use crate::cluster::shared_limit::SharedCount;
use crate::connector::TlsUpstream;
use crate::filters::rate_limit::RateLimiter;
use crate::filters::redirect::https_redirect;
use crate::filters::respond::Canned;
use crate::metrics::layout::{Epoch, SlotMap};
use crate::router::Router;
use crate::tls::session::TlsSession;
use crate::tls::watch::FileStamp;
use crate::tls::{ListenerTls, TlsError};
use crate::upstream::split::Split;
use crate::upstream::state::ServerState;
use crate::upstream::UpstreamPlan;

pub struct Snapshot {
    pub config: Arc<Config>,
    /// Where each listener, route, upstream and server counts in the metric shards; a
    /// listener's slot is also its identity across reloads (accept loops, connection counts).
    pub slots: SlotMap,
    pub listeners: Vec<ListenerPlan>,
    /// Per upstream (indexed like `config.upstreams`): groups, rings, shared server state.
    pub upstreams: Vec<UpstreamPlan>,
    /// `[tracing]` at work (`None`: no tracing at all); the previous snapshot's when the
    /// table is unchanged (one exporter thread per config).
    pub tracer: Option<Arc<crate::otel::Tracer>>,
    /// The HTTP cache stores, indexed like `config.caches`: a reload keeps a store of the
    /// same name and settings, with its entries.
    pub caches: crate::cache::Stores,
    /// The stamps of the listeners' certificate, key and CA files, taken before they were
    /// read for this snapshot: the certificate watcher reloads when the files' stamps differ.
    pub tls_files: Vec<FileStamp>,
    /// Gone once no snapshot up to this one is left: when freed metric slots may be
    /// given to other servers (`metrics::layout`).
    pub epoch: Arc<Epoch>,
}

/// Per-listener derived data, indexed like `config.listeners`.
pub struct ListenerPlan {
    pub router: Router,
    /// The default response, ready to write in each `Persistence` form.
    default: Canned,
    /// What each route does with a request, indexed like the listener's routes.
    pub routes: Vec<RoutePlan>,
    /// `redirect_https = true`: the redirect every request gets.
    pub redirect_https: Option<Redirect>,
    /// TLS termination: certificates and the rustls config all workers share.
    pub tls: Option<Arc<ListenerTls>>,
    /// Per route (indexed like `routes`): its rate limiter, shared by all workers.
    pub limiters: Vec<Option<Arc<RateLimiter>>>,
}

/// A route's target, prepared: a pool index, a split's schedule, a rendered response.
pub enum RoutePlan {
    Upstream(usize),
    Split(Split),
    Respond(Canned),
    /// The route's `redirect`, rendered per request from its template.
    Redirect(Redirect),
    /// The route's `files`, its root open.
    Files(Box<crate::files::FileServer>),
}

impl RoutePlan {
    fn new(route: &Route) -> RoutePlan {
        match &route.target {
            RouteTarget::Upstream(u) => RoutePlan::Upstream(*u),
            RouteTarget::Split(pools) => RoutePlan::Split(Split::new(pools, route.split_fallback)),
            RouteTarget::Respond(r) => RoutePlan::Respond(Canned::respond(r)),
            RouteTarget::Redirect(r) => RoutePlan::Redirect(r.clone()),
            RouteTarget::Files(f) => RoutePlan::Files(Box::new(crate::files::FileServer::new(f))),
        }
    }
}

/// A listener's certificate, key or CA file cannot be used: the config is not applied.
#[derive(Debug, thiserror::Error)]
#[error("listener {listener:?}: {error}")]
pub struct ListenerTlsError {
    pub listener: String,
    /// The config key naming the file, such as `listeners[1].tls.certs[0].cert`.
    pub field: String,
    pub error: TlsError,
}

impl ListenerTlsError {
    /// `error` of listener `index` of `config` (which has `tls`).
    pub fn new(config: &Config, index: usize, error: TlsError) -> ListenerTlsError {
        let listener = &config.listeners[index];
        let at = format!("listeners[{index}].tls");
        let field = match &listener.tls {
            Some(tls) => error.field_in(tls, &at),
            None => at,
        };
        ListenerTlsError {
            listener: listener.name.clone(),
            field,
            error,
        }
    }

    pub fn fix(&self) -> String {
        self.error.fix()
    }
}

impl Snapshot {
    /// A snapshot of `config`, its objects counting in `slots`; `upstream_tls`: the
    /// upstreams' TLS clients (`connector::tls::build_all`). Fails when a listener's TLS
    /// files cannot be used.
    pub fn new(
        config: Arc<Config>,
        slots: SlotMap,
        upstream_tls: Vec<Option<Arc<TlsUpstream>>>,
    ) -> Result<Snapshot, ListenerTlsError> {
        let tls = TlsPlans::build(&config, None)?;
        Ok(Snapshot::build(config, slots, None, tls, upstream_tls))
    }

    /// A snapshot of `config` that keeps the health state (active verdict, passive
    /// ejection) of every server that `previous` had in an upstream of the same name.
    /// `tls`: the TLS setups of `config`'s listeners (built first, since reading their
    /// files is what can fail); `upstream_tls`: the upstreams' TLS clients.
    pub fn with_previous(
        config: Arc<Config>,
        slots: SlotMap,
        previous: &Snapshot,
        tls: TlsPlans,
        upstream_tls: Vec<Option<Arc<TlsUpstream>>>,
    ) -> Snapshot {
        Snapshot::build(config, slots, Some(previous), tls, upstream_tls)
    }

    fn build(
        config: Arc<Config>,
        slots: SlotMap,
        previous: Option<&Snapshot>,
        tls: TlsPlans,
        upstream_tls: Vec<Option<Arc<TlsUpstream>>>,
    ) -> Snapshot {
        let listeners = config
            .listeners
            .iter()
            .zip(tls.plans)
            .map(|(l, tls)| {
                let mut plan = ListenerPlan::new(l, tls);
                plan.limiters = limiters(l, &config.cluster, previous);
                plan
            })
            .collect();
        let upstreams = config
            .upstreams
            .iter()
            .zip(slots.upstreams.iter())
            .zip(upstream_tls)
            .map(|((u, u_slots), tls)| {
                let mut plan =
                    UpstreamPlan::new(u, |i| previous?.server_state(&u.name, &u.servers[i]));
                plan.slot = u_slots.slot;
                plan.server_slots = u_slots.children.clone();
                plan.tls = tls;
                plan
            })
            .collect();
        let tracer = tracer(&config, previous);
        let caches = cache_stores(&config, previous);
        Snapshot {
            config,
            slots,
            listeners,
            upstreams,
            tracer,
            caches,
            tls_files: tls.files,
            epoch: Arc::default(),
        }
    }

    /// The TLS clients of this snapshot's upstreams, by upstream name (to keep unchanged
    /// ones across a reload).
    pub fn tls_clients(&self) -> Vec<(String, Arc<TlsUpstream>)> {
        self.config
            .upstreams
            .iter()
            .zip(&self.upstreams)
            .filter_map(|(u, plan)| Some((u.name.clone(), plan.tls.clone()?)))
            .collect()
    }

    /// The shared state of `server` if this snapshot's upstream `upstream` has it.
    fn server_state(&self, upstream: &str, server: &UpstreamServer) -> Option<Arc<ServerState>> {
        let u = self
            .config
            .upstreams
            .iter()
            .position(|o| o.name == upstream)?;
        let s = self.config.upstreams[u]
            .servers
            .iter()
            .position(|p| p.name == server.name && p.addr == server.addr)?;
        Some(self.upstreams[u].servers[s].clone())
    }

    /// The TLS setup of the listener named `name`, if it has one.
    pub fn listener_tls(&self, name: &str) -> Option<&ListenerTls> {
        let i = self.config.listeners.iter().position(|l| l.name == name)?;
        self.listeners[i].tls.as_deref()
    }

    /// The config position of the listener with metric slot `slot` (`None`: removed).
    #[inline]
    pub fn listener_index(&self, slot: usize) -> Option<usize> {
        self.slots.listeners.iter().position(|l| l.slot == slot)
    }

    /// Whether listener `index` still admits a connection whose TLS handshake settled
    /// `session` (`None`: plain HTTP): not once its client-auth policy (`required`, the CA
    /// certificates) differs from the one the handshake met. A client let in without a
    /// certificate, or with one of a CA since dropped, must not go on being served on its
    /// open connection after the reload that shut it out (nginx's old workers close theirs).
    #[inline]
    pub fn admits(&self, index: usize, session: Option<&TlsSession>) -> bool {
        match (session, &self.listeners[index].tls) {
            (Some(session), Some(tls)) => session.policy == tls.client_policy,
            _ => true,
        }
    }

    /// [`Snapshot::listener_index`] of a listener that still [admits](Snapshot::admits)
    /// the connection (`None`: removed, or the connection is shut out).
    #[inline]
    pub fn serving_index(&self, slot: usize, session: Option<&TlsSession>) -> Option<usize> {
        self.listener_index(slot)
            .filter(|&index| self.admits(index, session))
    }
}

/// The TLS setups of a config's listeners, in config order (`None`: plain), and the stamps
/// of the files they were read from.
pub struct TlsPlans {
    plans: Vec<Option<Arc<ListenerTls>>>,
    files: Vec<FileStamp>,
}

impl TlsPlans {
    /// Reads every TLS listener's files. A listener that `previous` had (same name) keeps
    /// its ticket keys and session cache, so sessions survive a reload.
    pub fn build(
        config: &Config,
        previous: Option<&Snapshot>,
    ) -> Result<TlsPlans, ListenerTlsError> {
        // Stamped before reading: a file changed while being read has a newer stamp, so
        // the watcher reads it again.
        let files = crate::tls::watch::stamps(config);
        let mut plans = Vec::with_capacity(config.listeners.len());
        for (i, listener) in config.listeners.iter().enumerate() {
            let Some(tls) = &listener.tls else {
                plans.push(None);
                continue;
            };
            let before = previous.and_then(|p| p.listener_tls(&listener.name));
            let built = ListenerTls::build(tls, before)
                .map_err(|error| ListenerTlsError::new(config, i, error))?;
            plans.push(Some(Arc::new(built)));
        }
        Ok(TlsPlans { plans, files })
    }
}

/// The cache stores of `config`: `previous`'s of the same name and kind (with its entries;
/// new sizes applied), else new.
fn cache_stores(config: &Config, previous: Option<&Snapshot>) -> crate::cache::Stores {
    let kept = |c: &weir_config::CacheStore| {
        let old = previous?.caches.iter().find(|s| s.serves(c))?;
        old.resize(c);
        Some(old.clone())
    };
    (config.caches.iter())
        .map(|c| kept(c).unwrap_or_else(|| crate::cache::Store::open(c.clone())))
        .collect()
}

/// The rate limiters of `listener`'s routes: the one `previous` had for the route of the
/// same listener and route name when its `rate_limit` (and, when shared, its Redis
/// settings) is unchanged (a reload keeps the counts), else a new one.
fn limiters(
    listener: &Listener,
    cluster: &Cluster,
    previous: Option<&Snapshot>,
) -> Vec<Option<Arc<RateLimiter>>> {
    let old = previous.and_then(|p| {
        let i = p
            .config
            .listeners
            .iter()
            .position(|o| o.name == listener.name)?;
        Some((&p.config.listeners[i], &p.listeners[i]))
    });
    listener
        .routes
        .iter()
        .map(|route| {
            let limit = route.filters.rate_limit.as_ref()?;
            let redis = limit.shared.as_ref().and_then(|s| cluster.redis(&s.redis));
            let kept = old.and_then(|(config, plan)| {
                let r = config.routes.iter().position(|o| o.name == route.name)?;
                let limiter = plan.limiters.get(r)?.as_ref()?;
                let same_redis = limiter.shared.as_ref().map(|s| &s.redis) == redis;
                (limiter.config == *limit && same_redis).then(|| limiter.clone())
            });
            Some(kept.unwrap_or_else(|| {
                let limiter = RateLimiter::new(limit);
                Arc::new(match (&limit.shared, redis) {
                    (Some(shared), Some(redis)) => {
                        let name = format!("{}/{}", listener.name, route.name);
                        limiter.sharing(SharedCount::new(redis.clone(), name, shared.on_error))
                    }
                    _ => limiter,
                })
            }))
        })
        .collect()
}

impl ListenerPlan {
    fn new(listener: &Listener, tls: Option<Arc<ListenerTls>>) -> ListenerPlan {
        ListenerPlan {
            router: Router::new(&listener.routes),
            default: Canned::default_response(&listener.default_response),
            routes: listener.routes.iter().map(RoutePlan::new).collect(),
            redirect_https: listener.redirect_https.map(https_redirect),
            tls,
            limiters: Vec::new(),
        }
    }

    /// The default response, ready to write in each `Persistence` form.
    pub fn default_response(&self) -> &Canned {
        &self.default
    }
}

/// The tracer of `config`'s `[tracing]`: `previous`'s when the table is unchanged, else a
/// new one (its exporter thread started; the old one ends with the old snapshots).
fn tracer(config: &Config, previous: Option<&Snapshot>) -> Option<Arc<crate::otel::Tracer>> {
    let table = config.tracing.as_ref()?;
    let kept = previous.and_then(|p| p.tracer.as_ref());
    if let Some(tracer) = kept.filter(|t| t.config == *table) {
        return Some(tracer.clone());
    }
    match crate::otel::Tracer::start(table.clone()) {
        Ok(tracer) => Some(tracer),
        Err(error) => {
            tracing::error!(%error, "cannot start the span exporter; tracing is off");
            None
        }
    }
}
