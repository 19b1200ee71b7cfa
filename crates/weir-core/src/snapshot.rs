//! The immutable, pre-computed form of a validated config that workers read.
//!
//! A snapshot is built once per config change and published through `ArcSwap`; a request
//! sees exactly one snapshot from start to end. Anything derivable from the config that the
//! request path would otherwise recompute (route tables, pre-rendered default responses)
//! lives here.

use std::sync::Arc;

use weir_config::{Config, Listener, UpstreamServer};

use crate::codec::http1::write::push_simple_response;
use crate::connector::TlsUpstream;
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
    /// The default response, ready to write, keeping the connection open.
    pub default_keep_alive: Box<[u8]>,
    /// The same with `Connection: close`.
    pub default_close: Box<[u8]>,
    /// Length of the body at the end of both (left out for HEAD requests).
    default_body_len: usize,
}

impl Snapshot {
    /// A snapshot of `config`, its objects counting in `slots`; `tls`: the upstreams' TLS
    /// clients (`connector::tls::build_all`).
    pub fn new(
        config: Arc<Config>,
        slots: SlotMap,
        tls: Vec<Option<Arc<TlsUpstream>>>,
    ) -> Snapshot {
        Snapshot::build(config, slots, tls, None)
    }

    /// A snapshot of `config` that keeps the health state (active verdict, passive
    /// ejection) of every server that `previous` had in an upstream of the same name.
    pub fn with_previous(
        config: Arc<Config>,
        slots: SlotMap,
        tls: Vec<Option<Arc<TlsUpstream>>>,
        previous: &Snapshot,
    ) -> Snapshot {
        Snapshot::build(config, slots, tls, Some(previous))
    }

    fn build(
        config: Arc<Config>,
        slots: SlotMap,
        tls: Vec<Option<Arc<TlsUpstream>>>,
        previous: Option<&Snapshot>,
    ) -> Snapshot {
        let listeners = config.listeners.iter().map(ListenerPlan::new).collect();
        let upstreams = config
            .upstreams
            .iter()
            .zip(slots.upstreams.iter())
            .zip(tls)
            .map(|((u, u_slots), tls)| {
                let mut plan =
                    UpstreamPlan::new(u, |i| previous?.server_state(&u.name, &u.servers[i]));
                plan.slot = u_slots.slot;
                plan.server_slots = u_slots.children.clone();
                plan.tls = tls;
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

    /// The config position of the listener with metric slot `slot` (`None`: removed).
    #[inline]
    pub fn listener_index(&self, slot: usize) -> Option<usize> {
        self.slots.listeners.iter().position(|l| l.slot == slot)
    }
}

impl ListenerPlan {
    fn new(listener: &Listener) -> ListenerPlan {
        let d = &listener.default_response;
        let render = |close| {
            let mut out = Vec::new();
            push_simple_response(
                &mut out,
                d.status,
                &d.content_type,
                d.body.as_bytes(),
                close,
            );
            out.into_boxed_slice()
        };
        ListenerPlan {
            router: Router::new(&listener.routes),
            default_keep_alive: render(false),
            default_close: render(true),
            default_body_len: d.body.len(),
        }
    }

    /// The default response to write; without its body for a HEAD request.
    pub fn default_response(&self, keep_alive: bool, is_head: bool) -> &[u8] {
        let full = if keep_alive {
            &self.default_keep_alive
        } else {
            &self.default_close
        };
        if is_head {
            &full[..full.len() - self.default_body_len]
        } else {
            full
        }
    }
}
