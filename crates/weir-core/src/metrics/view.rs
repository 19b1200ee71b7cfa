//! Walking the shards for the objects of one snapshot: where each listener, route, upstream
//! and server of its config counts (its `SlotMap`), summed over the workers. The scrape
//! (`encode`) and the dashboard's totals (`totals`) read the shards through it.

use std::sync::Arc;

use super::layout::SlotMap;
use super::shard::{ListenerMetrics, RouteMetrics, ServerMetrics, UpstreamMetrics, WorkerMetrics};

/// Every worker's shard and a snapshot's slots; the methods take config positions.
pub(super) trait ShardWalk {
    fn shards(&self) -> &[Arc<WorkerMetrics>];
    fn slots(&self) -> &SlotMap;

    /// `f` of every shard, added up (shards where it is `None` count nothing).
    fn sum(&self, f: impl Fn(&WorkerMetrics) -> Option<u64>) -> u64 {
        self.shards().iter().filter_map(|s| f(s)).sum()
    }

    fn listener<'a>(&self, s: &'a WorkerMetrics, li: usize) -> Option<&'a ListenerMetrics> {
        s.listener(self.slots().listeners.get(li)?.slot)
    }

    /// Route `ri` of listener `li`; 0 is the no-route slot, `r + 1` the config's route `r`.
    fn route<'a>(&self, s: &'a WorkerMetrics, li: usize, ri: usize) -> Option<&'a RouteMetrics> {
        let l = self.slots().listeners.get(li)?;
        let slot = l.route(ri.checked_sub(1));
        s.listener(l.slot)?.route(slot)
    }

    fn upstream<'a>(&self, s: &'a WorkerMetrics, ui: usize) -> Option<&'a UpstreamMetrics> {
        s.upstream(self.slots().upstreams.get(ui)?.slot)
    }

    fn server<'a>(&self, s: &'a WorkerMetrics, ui: usize, si: usize) -> Option<&'a ServerMetrics> {
        let u = self.slots().upstreams.get(ui)?;
        s.server(u.slot, *u.children.get(si)?)
    }

    /// Whether any worker counted a request of protocol index `pi` on route `ri` of `li`.
    fn saw(&self, li: usize, ri: usize, pi: usize) -> bool {
        self.shards()
            .iter()
            .any(|s| self.route(s, li, ri).is_some_and(|r| r.saw(pi)))
    }
}
