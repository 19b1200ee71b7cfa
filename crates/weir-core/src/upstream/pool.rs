//! The pool as a swappable snapshot: everything about an upstream's servers that the
//! request path needs and that only changes with the configuration.
//!
//! An [`UpstreamPlan`] is built per upstream whenever a snapshot is built: the primary and
//! backup groups, the consistent-hash rings, the sticky-cookie ids and `Set-Cookie` lines,
//! and the shared per-server [`ServerState`]. Replacing an upstream live means building a
//! new snapshot (with [`crate::snapshot::Snapshot::with_previous`], which carries the
//! health state of servers that stay) and publishing it; workers notice the new plan by
//! its id and rebuild their local state for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::connector::TlsUpstream;

use weir_config::{LbPolicy, Upstream};

use super::lb::consistent_hash::Ring;
use super::lb::sticky_cookie;
use super::state::{Passive, ServerState};

/// Group index of primary servers.
pub const PRIMARY: usize = 0;
/// Group index of backup servers.
pub const BACKUP: usize = 1;

/// Each server's weight is multiplied by this, so slow start can ramp even a weight-1
/// server in steps (1/16 .. 16/16) instead of jumping from 1 to 1.
pub const WEIGHT_SCALE: u32 = 16;

pub struct UpstreamPlan {
    /// Unique per built plan: worker-local state is rebuilt when it changes.
    pub id: u64,
    /// Per server (indexed like `Upstream::servers`).
    pub servers: Box<[Arc<ServerState>]>,
    /// Server indices of the primary and backup groups.
    pub groups: [Box<[usize]>; 2],
    /// Per server: its group and its position in it.
    pub position: Box<[(usize, usize)]>,
    /// `consistent_hash`: one ring per group, over the group's members.
    pub rings: Option<[Ring; 2]>,
    /// `sticky_cookie`: the cookie ids and `Set-Cookie` lines, per server.
    pub sticky: Option<Sticky>,
    pub passive: Passive,
    /// Metric slots of the upstream and of each server (see `metrics::layout`); set by
    /// the snapshot that owns the plan.
    pub slot: usize,
    pub server_slots: Box<[usize]>,
    /// The upstream's TLS client (`tls = { ... }`); `None`: plain TCP. Set by the snapshot.
    pub tls: Option<Arc<TlsUpstream>>,
}

pub struct Sticky {
    pub ids: Box<[u64]>,
    pub set_cookie: Box<[Box<[u8]>]>,
}

impl UpstreamPlan {
    /// Builds the plan of `upstream`. `previous` gives the state of a server kept from an
    /// earlier plan (by server index), so a reload does not reset health verdicts.
    pub fn new(
        upstream: &Upstream,
        previous: impl Fn(usize) -> Option<Arc<ServerState>>,
    ) -> UpstreamPlan {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let servers = (0..upstream.servers.len())
            .map(|i| previous(i).unwrap_or_default())
            .collect();
        let group_of = |backup: bool| -> Box<[usize]> {
            (0..upstream.servers.len())
                .filter(|&i| upstream.servers[i].backup == backup)
                .collect()
        };
        let groups = [group_of(false), group_of(true)];
        let mut position = vec![(PRIMARY, 0); upstream.servers.len()];
        for (g, members) in groups.iter().enumerate() {
            for (m, &s) in members.iter().enumerate() {
                position[s] = (g, m);
            }
        }
        let ring = |members: &[usize]| {
            Ring::new(members.iter().map(|&s| {
                let server = &upstream.servers[s];
                (server.name.as_str(), server.weight)
            }))
        };
        let rings = matches!(upstream.lb, LbPolicy::ConsistentHash(_))
            .then(|| [ring(&groups[PRIMARY]), ring(&groups[BACKUP])]);
        let sticky = match &upstream.lb {
            LbPolicy::StickyCookie { cookie } => {
                let ids: Box<[u64]> = upstream
                    .servers
                    .iter()
                    .map(|s| sticky_cookie::server_id(&upstream.name, &s.name))
                    .collect();
                let set_cookie = ids
                    .iter()
                    .map(|&id| sticky_cookie::set_cookie_line(cookie, id))
                    .collect();
                Some(Sticky { ids, set_cookie })
            }
            _ => None,
        };
        UpstreamPlan {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            servers,
            groups,
            position: position.into_boxed_slice(),
            rings,
            sticky,
            passive: Passive::new(&upstream.passive),
            slot: 0,
            server_slots: (0..upstream.servers.len()).collect(),
            tls: None,
        }
    }

    /// Whether some server may take a request: up by the active check and not passively
    /// ejected. A few atomic loads; the clock is read only for a server out of the normal
    /// state. (Used by split routes to leave a pool that has none; `choose` itself would
    /// still try an ejected server rather than none.)
    pub fn has_usable_server(&self) -> bool {
        self.servers.iter().any(|s| {
            s.is_up() && (s.is_normal() || s.ejected_for(super::state::now_ms()).is_none())
        })
    }

    /// The `Set-Cookie` line to add to a response from `server`, for sticky pools.
    pub fn set_cookie(&self, server: usize) -> Option<&[u8]> {
        Some(&self.sticky.as_ref()?.set_cookie[server])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::test_upstream as upstream;

    #[test]
    fn groups_positions_and_sticky_lines() {
        let u = upstream(
            "lb = \"sticky_cookie\"\nservers = [{ addr = \"127.0.0.1:1\" }, \
             { addr = \"127.0.0.1:2\", backup = true }, { addr = \"127.0.0.1:3\" }]\n",
        );
        let plan = UpstreamPlan::new(&u, |_| None);
        assert_eq!(&*plan.groups[PRIMARY], &[0, 2]);
        assert_eq!(&*plan.groups[BACKUP], &[1]);
        assert_eq!(&*plan.position, &[(0, 0), (1, 0), (0, 1)]);
        assert!(plan.rings.is_none());
        let line = plan.set_cookie(2).expect("sticky pool");
        assert!(line.starts_with(b"Set-Cookie: weir_server="));
        let other = UpstreamPlan::new(&u, |_| None);
        assert_ne!(plan.id, other.id);
    }

    #[test]
    fn previous_state_is_carried_over() {
        let u = upstream(
            "lb = \"consistent_hash\"\nservers = [{ addr = \"127.0.0.1:1\" }, { addr = \"127.0.0.1:2\" }]\n",
        );
        let old = UpstreamPlan::new(&u, |_| None);
        old.servers[1].up.store(false, Ordering::Relaxed);
        let new = UpstreamPlan::new(&u, |i| Some(old.servers[i].clone()));
        assert!(!new.servers[1].is_up());
        assert!(new.rings.as_ref().is_some_and(|r| !r[PRIMARY].is_empty()));
    }
}
