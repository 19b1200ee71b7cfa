//! The immutable, pre-computed form of a validated config that workers read.
//!
//! A snapshot is built once per config change and published through `ArcSwap`; a request
//! sees exactly one snapshot from start to end. Anything derivable from the config that the
//! request path would otherwise recompute (route tables, pre-rendered default responses)
//! lives here.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use weir_config::{Config, Listener};

use crate::codec::http1::write::push_simple_response;
use crate::router::Router;
use crate::upstream::UpstreamPlan;

pub struct Snapshot {
    pub config: Arc<Config>,
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
    pub fn new(config: Arc<Config>) -> Snapshot {
        let listeners = config.listeners.iter().map(ListenerPlan::new).collect();
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| UpstreamPlan::new(u, |_| None))
            .collect();
        Snapshot {
            config,
            listeners,
            upstreams,
        }
    }

    /// A snapshot of `config` that keeps the health state (active verdict, passive
    /// ejection) of every server that `previous` had in an upstream of the same name.
    pub fn with_previous(config: Arc<Config>, previous: &Snapshot) -> Snapshot {
        let mut next = Snapshot::new(config.clone());
        next.upstreams = config
            .upstreams
            .iter()
            .map(|u| {
                let old = previous
                    .config
                    .upstreams
                    .iter()
                    .position(|o| o.name == u.name);
                UpstreamPlan::new(u, |i| {
                    let o = old?;
                    let s = &u.servers[i];
                    let j = previous.config.upstreams[o]
                        .servers
                        .iter()
                        .position(|p| p.name == s.name && p.addr == s.addr)?;
                    Some(previous.upstreams[o].servers[j].clone())
                })
            })
            .collect();
        next
    }

    /// The health verdict flags, per upstream and server (what the metrics scrape reads).
    pub fn server_up_flags(&self) -> Vec<Vec<Arc<AtomicBool>>> {
        self.upstreams
            .iter()
            .map(|p| p.servers.iter().map(|s| s.up.clone()).collect())
            .collect()
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
