//! Choosing a server: availability, groups (primary, then backup), and the policy.
//!
//! A server is available for a pick when the active check says it is up, it is not
//! passively ejected, this worker has fewer than its share of `max_connections` in flight
//! to it, and the request has not tried it already. Its effective weight is its configured
//! weight x [`WEIGHT_SCALE`], reduced during slow start.
//!
//! Order: primaries; backups if no primary is available; then, if passive ejection has
//! taken out every server that is otherwise usable, the same again ignoring ejection
//! ("panic mode", as Envoy does: better to try an ejected server than refuse everyone).
//! A server the active check marked down is never chosen; no choice at all is a 503.

use std::cell::Cell;

use weir_config::{LbPolicy, Upstream};

use super::key::RequestKey;
use super::lb::{self, Candidates};
use super::local::LocalState;
use super::pool::{UpstreamPlan, BACKUP, PRIMARY, WEIGHT_SCALE};
use super::state::{now_ms, now_ns};

/// A choice: the server index, and whether its response should set the sticky cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub server: usize,
    pub group: usize,
    pub member: usize,
    pub set_cookie: bool,
}

/// Chooses a server for `key`, not one of `tried`.
pub fn choose(
    st: &mut LocalState,
    plan: &UpstreamPlan,
    upstream: &Upstream,
    key: RequestKey,
    tried: &[usize],
) -> Option<Choice> {
    if tried.is_empty() {
        if let Some(choice) = only_server(st, plan, upstream, key) {
            return Some(choice);
        }
    }
    for ignore_ejection in [false, true] {
        for group in [PRIMARY, BACKUP] {
            let members = &plan.groups[group];
            if members.is_empty() {
                continue;
            }
            let view = GroupView {
                plan,
                upstream,
                members,
                in_flight: &st.in_flight,
                max_in_flight: &st.max_in_flight,
                tried,
                ignore_ejection,
                now: Cell::new(None),
            };
            if let Some(member) = sticky_member(plan, key, group, &view) {
                return Some(Choice {
                    server: members[member],
                    group,
                    member,
                    set_cookie: false,
                });
            }
            let gs = &mut st.groups[group];
            let member = match &upstream.lb {
                LbPolicy::RoundRobin => gs.round_robin.pick(&view),
                LbPolicy::WeightedRoundRobin | LbPolicy::StickyCookie { .. } => {
                    gs.smooth.pick(&view)
                }
                LbPolicy::LeastConnections => gs.least.pick(&view),
                LbPolicy::Random => lb::random::pick(&mut st.rng, &view),
                LbPolicy::P2cEwma => lb::p2c_ewma::pick(&mut st.rng, &view, &gs.ewma, now_ns()),
                LbPolicy::ConsistentHash(_) => match (key.hash, &plan.rings) {
                    (Some(hash), Some(rings)) => rings[group].pick(hash, &view),
                    _ => gs.smooth.pick(&view),
                },
            };
            if let Some(member) = member {
                let server = members[member];
                let set_cookie = plan
                    .sticky
                    .as_ref()
                    .is_some_and(|s| key.sticky != Some(s.ids[server]));
                return Some(Choice {
                    server,
                    group,
                    member,
                    set_cookie,
                });
            }
        }
    }
    None
}

/// The one primary server of `upstream`, on a request's first try, when it is available
/// at its full weight: every policy (and the sticky cookie, which can name no other
/// available server) picks it, so the loop below and the policy's state are skipped. `None`:
/// the loop decides (several primaries, or this one down, ejected, full or slow-starting).
#[inline]
fn only_server(
    st: &LocalState,
    plan: &UpstreamPlan,
    upstream: &Upstream,
    key: RequestKey,
) -> Option<Choice> {
    let [server] = *plan.groups[PRIMARY] else {
        return None;
    };
    let state = &plan.servers[server];
    let full = st.in_flight[server] >= st.max_in_flight[server];
    if !state.is_up() || !state.is_normal() || full || upstream.servers[server].weight == 0 {
        return None;
    }
    let set_cookie = plan
        .sticky
        .as_ref()
        .is_some_and(|s| key.sticky != Some(s.ids[server]));
    Some(Choice {
        server,
        group: PRIMARY,
        member: 0,
        set_cookie,
    })
}

/// The member of `group` the request's sticky cookie names, if it is available.
fn sticky_member(
    plan: &UpstreamPlan,
    key: RequestKey,
    group: usize,
    view: &GroupView<'_>,
) -> Option<usize> {
    let server = lb::sticky_cookie::member_of(&plan.sticky.as_ref()?.ids, key.sticky?)?;
    let (g, member) = plan.position[server];
    (g == group && view.weight(member) > 0).then_some(member)
}

/// One group as the policy sees it.
struct GroupView<'a> {
    plan: &'a UpstreamPlan,
    upstream: &'a Upstream,
    members: &'a [usize],
    in_flight: &'a [u32],
    max_in_flight: &'a [u32],
    tried: &'a [usize],
    ignore_ejection: bool,
    /// Read once per pick, and only if some server needs it.
    now: Cell<Option<u64>>,
}

impl GroupView<'_> {
    fn now(&self) -> u64 {
        match self.now.get() {
            Some(now) => now,
            None => {
                let now = now_ms();
                self.now.set(Some(now));
                now
            }
        }
    }
}

impl Candidates for GroupView<'_> {
    fn len(&self) -> usize {
        self.members.len()
    }

    fn weight(&self, member: usize) -> u32 {
        let s = self.members[member];
        let state = &self.plan.servers[s];
        if !state.is_up() || self.in_flight[s] >= self.max_in_flight[s] || self.tried.contains(&s) {
            return 0;
        }
        let base = self.upstream.servers[s].weight * WEIGHT_SCALE;
        if state.is_normal() {
            return base;
        }
        state.weight(base, self.now(), &self.plan.passive, self.ignore_ejection)
    }

    fn in_flight(&self, member: usize) -> u32 {
        self.in_flight[self.members[member]]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::upstream::lb::sticky_cookie::server_id;
    use crate::upstream::retry::Tried;
    use crate::upstream::test_upstream as upstream;
    use crate::upstream::WorkerUpstreams;

    /// Servers 1..=3 on 127.0.0.1, with `extra` keys for the third.
    fn three(lb: &str, third: &str) -> (Upstream, UpstreamPlan) {
        let u = upstream(&format!(
            "lb = \"{lb}\"\nservers = [{{ addr = \"127.0.0.1:1\" }}, {{ addr = \"127.0.0.1:2\" }}, \
             {{ addr = \"127.0.0.1:3\"{third} }}]\n"
        ));
        let plan = UpstreamPlan::new(&u, |_| None);
        (u, plan)
    }

    fn picks(w: &WorkerUpstreams, plan: &UpstreamPlan, u: &Upstream, n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                w.pick(0, plan, u, RequestKey::default())
                    .map_or(usize::MAX, |p| p.server)
            })
            .collect()
    }

    #[test]
    fn backups_only_while_no_primary_is_available() {
        let (u, plan) = three("round_robin", ", backup = true");
        let w = WorkerUpstreams::new(1, Default::default());
        assert_eq!(picks(&w, &plan, &u, 4), [0, 1, 0, 1]);
        plan.servers[0].up.store(false, Relaxed);
        assert_eq!(picks(&w, &plan, &u, 2), [1, 1]);
        plan.servers[1].up.store(false, Relaxed);
        assert_eq!(picks(&w, &plan, &u, 2), [2, 2]);
        plan.servers[2].up.store(false, Relaxed);
        assert!(w.pick(0, &plan, &u, RequestKey::default()).is_none(), "503");
    }

    #[test]
    fn ejected_servers_are_skipped_unless_all_are_ejected() {
        let (u, plan) = three("round_robin", "");
        let w = WorkerUpstreams::new(1, Default::default());
        let now = now_ms();
        assert!(
            plan.servers[0].record_failure(now, &plan.passive),
            "max_fails 1"
        );
        assert!(!picks(&w, &plan, &u, 6).contains(&0));
        plan.servers[1].record_failure(now, &plan.passive);
        plan.servers[2].record_failure(now, &plan.passive);
        // Every server ejected: panic mode uses them all rather than refusing.
        let all = picks(&w, &plan, &u, 6);
        assert!([0, 1, 2].iter().all(|s| all.contains(s)), "{all:?}");
        // An actively-down server is not used even then.
        plan.servers[1].up.store(false, Relaxed);
        assert!(!picks(&w, &plan, &u, 6).contains(&1));
    }

    #[test]
    fn max_connections_and_in_flight_guards() {
        let (u, plan) = three("round_robin", ", max_connections = 1");
        let w = WorkerUpstreams::new(1, Default::default());
        let held: Vec<_> = (0..3)
            .map(|_| w.pick(0, &plan, &u, RequestKey::default()).expect("pick"))
            .collect();
        assert_eq!(held.iter().map(|p| p.server).collect::<Vec<_>>(), [0, 1, 2]);
        // Server 2 is full while its pick lives.
        assert_eq!(picks(&w, &plan, &u, 4), [0, 1, 0, 1]);
        drop(held);
        assert!(picks(&w, &plan, &u, 3).contains(&2));
    }

    #[test]
    fn retries_go_to_untried_servers_within_attempts() {
        let u = upstream(
            "servers = [{ addr = \"127.0.0.1:1\" }, { addr = \"127.0.0.1:2\" }, { addr = \"127.0.0.1:3\" }]\n\
             [upstreams.u.retry]\nattempts = 2\n",
        );
        let plan = UpstreamPlan::new(&u, |_| None);
        let w = WorkerUpstreams::new(1, Default::default());
        let key = RequestKey::default();
        let first = w.pick(0, &plan, &u, key).expect("pick");
        let mut tried = Tried::new(first.server);
        let second = w.retry(0, &plan, &u, key, &tried).expect("retry");
        assert_ne!(second.server, first.server);
        tried.push(second.server);
        let third = w.retry(0, &plan, &u, key, &tried).expect("retry");
        assert!(!tried.as_slice().contains(&third.server));
        tried.push(third.server);
        assert!(
            w.retry(0, &plan, &u, key, &tried).is_none(),
            "attempts used up"
        );
    }

    #[test]
    fn sticky_cookie_is_honoured_while_its_server_is_up() {
        let (u, plan) = three("sticky_cookie", "");
        let w = WorkerUpstreams::new(1, Default::default());
        let id = server_id("u", "127.0.0.1:3");
        let key = RequestKey {
            hash: None,
            sticky: Some(id),
        };
        for _ in 0..5 {
            let p = w.pick(0, &plan, &u, key).expect("pick");
            assert_eq!((p.server, p.set_cookie), (2, false));
        }
        plan.servers[2].up.store(false, Relaxed);
        let p = w.pick(0, &plan, &u, key).expect("pick");
        assert!(p.server != 2 && p.set_cookie, "re-pinned elsewhere");
        let fresh = w.pick(0, &plan, &u, RequestKey::default()).expect("pick");
        assert!(fresh.set_cookie);
    }

    /// One primary (`only_server`'s case) and a backup: the primary while it is
    /// available at full weight, the backup while it is full, down or ejected; the
    /// sticky cookie set unless it names the primary.
    #[test]
    fn one_primary_is_picked_only_while_available() {
        let u = upstream(
            "lb = \"sticky_cookie\"\nservers = [{ addr = \"127.0.0.1:1\", max_connections = 1 }, \
             { addr = \"127.0.0.1:2\", backup = true }]\n",
        );
        let plan = UpstreamPlan::new(&u, |_| None);
        let w = WorkerUpstreams::new(1, Default::default());
        let pinned = RequestKey {
            hash: None,
            sticky: Some(server_id("u", "127.0.0.1:1")),
        };
        let held = w.pick(0, &plan, &u, pinned).expect("pick");
        assert_eq!((held.server, held.set_cookie), (0, false));
        let p = w.pick(0, &plan, &u, RequestKey::default()).expect("pick");
        assert_eq!((p.server, p.set_cookie), (1, true), "the primary is full");
        drop((held, p));
        let p = w.pick(0, &plan, &u, RequestKey::default()).expect("pick");
        assert_eq!((p.server, p.set_cookie), (0, true));
        drop(p);
        plan.servers[0].record_failure(now_ms(), &plan.passive);
        assert_eq!(picks(&w, &plan, &u, 2), [1, 1], "ejected");
    }

    #[test]
    fn a_new_plan_resets_the_worker_state() {
        let (u, plan) = three("round_robin", "");
        let w = WorkerUpstreams::new(1, Default::default());
        assert_eq!(picks(&w, &plan, &u, 2), [0, 1]);
        let next = UpstreamPlan::new(&u, |i| Some(plan.servers[i].clone()));
        assert_eq!(
            picks(&w, &next, &u, 2),
            [0, 1],
            "fresh cursor for the new plan"
        );
    }

    /// The shard's in-flight gauge follows picks from pick to drop, across a new plan.
    #[test]
    fn picks_count_in_the_shards_in_flight_gauge() {
        let (u, plan) = three("round_robin", "");
        let mut layout = crate::metrics::layout::Layout::default();
        let config = weir_config::parse_str(
            "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n[upstreams.u]\n\
             servers = [{ addr = \"127.0.0.1:1\" }, { addr = \"127.0.0.1:2\" }, \
             { addr = \"127.0.0.1:3\" }]\n",
            "t",
        )
        .unwrap();
        let slots = layout.assign(&config);
        let shard = std::sync::Arc::new(crate::metrics::WorkerMetrics::new(&slots));
        let gauge = |i| shard.server(0, i).unwrap().in_flight.get();
        let w = WorkerUpstreams::new(1, shard.clone());
        let first = w.pick(0, &plan, &u, RequestKey::default()).expect("pick");
        let second = w.pick(0, &plan, &u, RequestKey::default()).expect("pick");
        assert_eq!((gauge(0), gauge(1), gauge(2)), (1, 1, 0));
        let next = UpstreamPlan::new(&u, |i| Some(plan.servers[i].clone()));
        let third = w.pick(0, &next, &u, RequestKey::default()).expect("pick");
        assert_eq!(
            (third.server, gauge(0)),
            (0, 2),
            "the gauge carries over plans"
        );
        drop((first, second));
        assert_eq!((gauge(0), gauge(1)), (1, 0));
        drop(third);
        assert_eq!(gauge(0), 0);
    }
}
