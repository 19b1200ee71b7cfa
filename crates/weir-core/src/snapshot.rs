//! The immutable, pre-computed form of a validated config that workers read.
//!
//! A snapshot is built once per config change and published through `ArcSwap`; a request
//! sees exactly one snapshot from start to end. Anything derivable from the config that the
//! request path would otherwise recompute (route tables, pre-rendered default responses)
//! lives here.

use std::sync::Arc;

use weir_config::{Config, Listener, UpstreamServer};

use weir_config::{Redirect, RouteTarget};

use crate::filters::redirect::https_redirect;
use crate::filters::respond::Canned;
use crate::metrics::layout::SlotMap;
use crate::router::Router;
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
}

/// A route's target, prepared: a pool index, a split's schedule, a rendered response.
pub enum RoutePlan {
    Upstream(usize),
    Split(Split),
    Respond(Canned),
    /// The route's `redirect`, rendered per request from its template.
    Redirect(Redirect),
}

impl RoutePlan {
    fn new(target: &RouteTarget) -> RoutePlan {
        match target {
            RouteTarget::Upstream(u) => RoutePlan::Upstream(*u),
            RouteTarget::Split(pools) => RoutePlan::Split(Split::new(pools)),
            RouteTarget::Respond(r) => RoutePlan::Respond(Canned::respond(r)),
            RouteTarget::Redirect(r) => RoutePlan::Redirect(r.clone()),
        }
    }
}

impl Snapshot {
    /// A snapshot of `config`, its objects counting in `slots`.
    pub fn new(config: Arc<Config>, slots: SlotMap) -> Snapshot {
        Snapshot::build(config, slots, None)
    }

    /// A snapshot of `config` that keeps the health state (active verdict, passive
    /// ejection) of every server that `previous` had in an upstream of the same name.
    pub fn with_previous(config: Arc<Config>, slots: SlotMap, previous: &Snapshot) -> Snapshot {
        Snapshot::build(config, slots, Some(previous))
    }

    fn build(config: Arc<Config>, slots: SlotMap, previous: Option<&Snapshot>) -> Snapshot {
        let listeners = config.listeners.iter().map(ListenerPlan::new).collect();
        let upstreams = config
            .upstreams
            .iter()
            .zip(slots.upstreams.iter())
            .map(|(u, u_slots)| {
                let mut plan =
                    UpstreamPlan::new(u, |i| previous?.server_state(&u.name, &u.servers[i]));
                plan.slot = u_slots.slot;
                plan.server_slots = u_slots.children.clone();
                plan
            })
            .collect();
        Snapshot {
            config,
            slots,
            listeners,
            upstreams,
        }
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

    /// The config position of the listener with metric slot `slot` (`None`: removed).
    #[inline]
    pub fn listener_index(&self, slot: usize) -> Option<usize> {
        self.slots.listeners.iter().position(|l| l.slot == slot)
    }
}

impl ListenerPlan {
    fn new(listener: &Listener) -> ListenerPlan {
        ListenerPlan {
            router: Router::new(&listener.routes),
            default: Canned::default_response(&listener.default_response),
            routes: listener
                .routes
                .iter()
                .map(|r| RoutePlan::new(&r.target))
                .collect(),
            redirect_https: listener.redirect_https.then(https_redirect),
        }
    }

    /// The default response, ready to write in each `Persistence` form.
    pub fn default_response(&self) -> &Canned {
        &self.default
    }
}
