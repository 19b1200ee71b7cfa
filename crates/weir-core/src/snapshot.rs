//! The immutable, pre-computed form of a validated config that workers read.
//!
//! A snapshot is built once per config change and published through `ArcSwap`; a request
//! sees exactly one snapshot from start to end. Anything derivable from the config that the
//! request path would otherwise recompute (route tables, pre-rendered default responses)
//! lives here.

use std::sync::Arc;

use weir_config::{Config, Listener, UpstreamServer};

use crate::codec::http1::write::{push_simple_response, Persistence};
use crate::filters::rate_limit::RateLimiter;
use crate::metrics::layout::SlotMap;
use crate::router::Router;
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
    /// The default response, ready to write, for each `Persistence` (indexed by it): with
    /// `Connection: close`, without a `Connection` header (HTTP/1.1 keep-alive), and with
    /// `Connection: keep-alive` (HTTP/1.0 keep-alive).
    default_responses: [Box<[u8]>; Persistence::COUNT],
    /// Length of the body at the end of each (left out for HEAD requests).
    default_body_len: usize,
    /// Per route (indexed like `routes`): its rate limiter, shared by all workers.
    pub limiters: Vec<Option<Arc<RateLimiter>>>,
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
        let listeners = config
            .listeners
            .iter()
            .map(|l| {
                let mut plan = ListenerPlan::new(l);
                plan.limiters = limiters(l, previous);
                plan
            })
            .collect();
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

/// The rate limiters of `listener`'s routes: the one `previous` had for the route of the
/// same listener and route name when its `rate_limit` is unchanged (a reload keeps the
/// counts), else a new one.
fn limiters(listener: &Listener, previous: Option<&Snapshot>) -> Vec<Option<Arc<RateLimiter>>> {
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
            let kept = old.and_then(|(config, plan)| {
                let r = config.routes.iter().position(|o| o.name == route.name)?;
                let limiter = plan.limiters.get(r)?.as_ref()?;
                (limiter.config == *limit).then(|| limiter.clone())
            });
            Some(kept.unwrap_or_else(|| Arc::new(RateLimiter::new(limit))))
        })
        .collect()
}

impl ListenerPlan {
    fn new(listener: &Listener) -> ListenerPlan {
        let d = &listener.default_response;
        let render = |persistence| {
            let mut out = Vec::new();
            push_simple_response(
                &mut out,
                d.status,
                &d.content_type,
                d.body.as_bytes(),
                persistence,
            );
            out.into_boxed_slice()
        };
        ListenerPlan {
            router: Router::new(&listener.routes),
            // In declaration order: `default_response` indexes by discriminant.
            default_responses: [
                Persistence::Close,
                Persistence::KeepAlive,
                Persistence::KeepAlive10,
            ]
            .map(render),
            default_body_len: d.body.len(),
            limiters: Vec::new(),
        }
    }

    /// The default response to write; without its body for a HEAD request.
    pub fn default_response(&self, persistence: Persistence, is_head: bool) -> &[u8] {
        let full = &self.default_responses[persistence as usize];
        if is_head {
            &full[..full.len() - self.default_body_len]
        } else {
            full
        }
    }
}
