//! Per-worker upstream state: policy cursors and weights, in-flight counts, latency
//! estimates, the random generator and the retry budget. Worker-local (`RefCell`, no
//! atomics); rebuilt when a new pool plan is published. The in-flight counts are also
//! written to the worker's metric shard (`weir_upstream_in_flight`, the dashboard), whose
//! gauges, unlike this state, carry over from plan to plan.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use weir_config::{LbPolicy, Upstream};

use super::key::RequestKey;
use super::lb::least_connections::LeastConnections;
use super::lb::p2c_ewma::{PeakEwma, PENALTY_NS};
use super::lb::rng::XorShift;
use super::lb::round_robin::RoundRobin;
use super::lb::weighted_round_robin::SmoothWeighted;
use super::pool::UpstreamPlan;
use super::retry::{Outcome, RetryBudget, Tried};
use super::select::{choose, Choice};
use super::state::{now_ms, now_ns};
use crate::metrics::shard::Counter;
use crate::metrics::WorkerMetrics;

/// Policy state of one group (primary or backup) on one worker.
#[derive(Debug, Default)]
pub struct GroupState {
    pub round_robin: RoundRobin,
    pub smooth: SmoothWeighted,
    pub least: LeastConnections,
    /// Per member.
    pub ewma: Vec<PeakEwma>,
}

#[derive(Debug)]
pub struct LocalState {
    pub groups: [GroupState; 2],
    /// Per server: requests this worker has in flight to it.
    pub in_flight: Vec<u32>,
    /// Per server: this worker's share of `max_connections` (`u32::MAX`: unlimited).
    pub max_in_flight: Vec<u32>,
    pub rng: XorShift,
    pub budget: RetryBudget,
}

/// One upstream's state on this worker, for one plan.
#[derive(Debug)]
pub struct LocalUpstream {
    plan_id: u64,
    state: RefCell<LocalState>,
    /// Per server: the in-flight gauge of the worker's shard (a detached one where the
    /// shard has no slot, as in unit tests).
    gauges: Box<[Arc<Counter>]>,
}

impl LocalUpstream {
    fn new(
        plan: &UpstreamPlan,
        upstream: &Upstream,
        workers: usize,
        metrics: &WorkerMetrics,
    ) -> LocalUpstream {
        let gauges = plan
            .server_slots
            .iter()
            .map(|&slot| {
                metrics
                    .server(plan.slot, slot)
                    .map_or_else(Default::default, |m| m.in_flight.clone())
            })
            .collect();
        let workers = workers.max(1) as u32;
        let groups = [0, 1].map(|g| GroupState {
            ewma: vec![PeakEwma::default(); plan.groups[g].len()],
            ..GroupState::default()
        });
        LocalUpstream {
            plan_id: plan.id,
            state: RefCell::new(LocalState {
                groups,
                in_flight: vec![0; upstream.servers.len()],
                max_in_flight: upstream
                    .servers
                    .iter()
                    // A draining server takes no new requests: a share of zero.
                    .map(|s| match s.max_connections {
                        _ if s.drain => 0,
                        None => u32::MAX,
                        Some(m) => m.div_ceil(workers),
                    })
                    .collect(),
                rng: XorShift::from_entropy(),
                budget: RetryBudget::default(),
            }),
            gauges,
        }
    }
}

/// All upstreams' state on this worker, indexed like `Config::upstreams`.
#[derive(Debug)]
pub struct WorkerUpstreams {
    locals: RefCell<Vec<Option<Rc<LocalUpstream>>>>,
    workers: usize,
    /// The worker's metric shard, where the in-flight gauges are.
    metrics: Arc<WorkerMetrics>,
}

/// The chosen server of one attempt. Counts as in flight until dropped.
#[derive(Debug)]
pub struct Pick {
    pub server: usize,
    /// The response should carry the sticky cookie for `server`.
    pub set_cookie: bool,
    choice: Choice,
    local: Rc<LocalUpstream>,
}

impl Drop for Pick {
    fn drop(&mut self) {
        let mut st = self.local.state.borrow_mut();
        if let Some(n) = st.in_flight.get_mut(self.server) {
            *n = n.saturating_sub(1);
        }
        if let Some(gauge) = self.local.gauges.get(self.server) {
            gauge.dec();
        }
    }
}

impl WorkerUpstreams {
    /// `workers`: how many workers share each server's `max_connections`; `metrics`: the
    /// worker's shard.
    pub fn new(workers: usize, metrics: Arc<WorkerMetrics>) -> WorkerUpstreams {
        WorkerUpstreams {
            locals: RefCell::new(Vec::new()),
            workers,
            metrics,
        }
    }

    fn local(&self, index: usize, plan: &UpstreamPlan, upstream: &Upstream) -> Rc<LocalUpstream> {
        let mut locals = self.locals.borrow_mut();
        if locals.len() <= index {
            locals.resize(index + 1, None);
        }
        match &locals[index] {
            Some(local) if local.plan_id == plan.id => local.clone(),
            _ => {
                let local = Rc::new(LocalUpstream::new(
                    plan,
                    upstream,
                    self.workers,
                    &self.metrics,
                ));
                locals[index] = Some(local.clone());
                local
            }
        }
    }

    /// The first attempt's server for a request to upstream `index`; `None`: no server is
    /// available (503).
    pub fn pick(
        &self,
        index: usize,
        plan: &UpstreamPlan,
        upstream: &Upstream,
        key: RequestKey,
    ) -> Option<Pick> {
        let local = self.local(index, plan, upstream);
        let choice = {
            let mut st = local.state.borrow_mut();
            st.budget.deposit(upstream.retry.budget_percent);
            let choice = choose(&mut st, plan, upstream, key, &[])?;
            st.in_flight[choice.server] += 1;
            choice
        };
        Some(Pick::new(choice, local))
    }

    /// Another server for a request that failed on every server in `tried`, if the retry
    /// policy's attempts, a different available server and the retry budget allow it.
    pub fn retry(
        &self,
        index: usize,
        plan: &UpstreamPlan,
        upstream: &Upstream,
        key: RequestKey,
        tried: &Tried,
    ) -> Option<Pick> {
        if tried.retries() >= upstream.retry.attempts {
            return None;
        }
        let local = self.local(index, plan, upstream);
        let choice = {
            let mut st = local.state.borrow_mut();
            if !st.budget.has_token() {
                return None;
            }
            let choice = choose(&mut st, plan, upstream, key, tried.as_slice())?;
            st.budget.withdraw();
            st.in_flight[choice.server] += 1;
            choice
        };
        Some(Pick::new(choice, local))
    }
}

impl Pick {
    fn new(choice: Choice, local: Rc<LocalUpstream>) -> Pick {
        if let Some(gauge) = local.gauges.get(choice.server) {
            gauge.inc();
        }
        Pick {
            server: choice.server,
            set_cookie: choice.set_cookie,
            choice,
            local,
        }
    }

    /// Records how the attempt ended: its passive health and, for `p2c_ewma`, the server's
    /// latency estimate (time to the response head; a failure counts as a long one). Logs
    /// an ejection.
    pub fn record(
        &self,
        plan: &UpstreamPlan,
        upstream: &Upstream,
        outcome: Outcome,
        elapsed: Duration,
    ) {
        if matches!(outcome, Outcome::Client | Outcome::Local) {
            return;
        }
        let failed = outcome.is_server_failure(&upstream.retry.on);
        if upstream.lb == LbPolicy::P2cEwma {
            // A fast 502-504 is a server shedding load, whether or not it counts for
            // ejection: it must not look like the fastest server (a black hole). The
            // penalty decays, so a client provoking it ejects nothing.
            let slow = failed || matches!(outcome, Outcome::Status(502..=504));
            let mut st = self.local.state.borrow_mut();
            let c = self.choice;
            if let Some(e) = st.groups[c.group].ewma.get_mut(c.member) {
                let rtt = if slow {
                    elapsed.max(Duration::from_nanos(PENALTY_NS as u64))
                } else {
                    elapsed
                };
                e.observe(rtt, now_ns());
            }
        }
        let state = &plan.servers[self.server];
        if !failed {
            state.record_success();
            return;
        }
        let now = now_ms();
        if state.record_failure(now, &plan.passive) {
            let server = &upstream.servers[self.server];
            tracing::warn!(
                upstream = %upstream.name,
                server = %server.name,
                reason = outcome.reason(),
                max_fails = plan.passive.max_fails,
                ejected_for = ?upstream.passive.fail_timeout,
                "server ejected after consecutive failures"
            );
        }
    }
}
