//! DNS service discovery of pools (`[upstreams.NAME] discover = { dns, ... }`): one task
//! per discovered pool on the cluster thread, following the running config.
//!
//! Each task looks its name up (`dns`) at once, then every `interval` (with `respect_ttl`,
//! when the answer's TTL runs out if that is sooner, but not more often than once a
//! second). An answer that differs from the last becomes the pool's servers through
//! [`Applier::discovered`], the path every config change takes: a new snapshot is
//! published; servers that stay keep their health state (`Snapshot::with_previous`), new
//! ones take requests from the next pick, and removed ones get no new requests while those
//! in flight finish on the snapshot they started with. A failed lookup, a timeout, an
//! empty answer or the system's DNS settings unreadable (no resolver built yet) keeps the last servers: it is counted (`weir_discovery_lookups_total{result=
//! "error"}`) and logged once until a lookup succeeds again, and the next lookup comes
//! sooner than `interval` (1 s after the first failure, doubling, up to `interval`), so a
//! pool that started with DNS down gets its servers soon after DNS is back.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use tokio::task::JoinHandle;
use weir_config::{Discover, UpstreamServer};

use super::dns;
use crate::metrics::cluster::ClusterMetrics;
use crate::reload::Applier;

/// How often the running config is checked for discovered pools added, changed or removed.
const SNAPSHOT_POLL: Duration = Duration::from_millis(200);
/// The soonest a lookup follows the last with `respect_ttl` (a TTL of 0 would spin), and
/// the wait after a first failed lookup (doubling with each failure after it).
const MIN_WAIT: Duration = Duration::from_secs(1);

/// Runs the discovery tasks of the running config's pools, forever. `first_round` gets one
/// message per pool of the config at start once its first lookup is done.
pub(crate) async fn supervise(
    applier: Applier,
    metrics: Arc<ClusterMetrics>,
    first_round: std::sync::mpsc::Sender<()>,
) {
    let mut tasks: BTreeMap<String, (Discover, JoinHandle<()>)> = BTreeMap::new();
    let mut first_round = Some(first_round);
    let mut seen = None;
    loop {
        let generation = applier.shared.generation.load(Ordering::Acquire);
        if seen != Some(generation) {
            seen = Some(generation);
            let config = applier.shared.snapshot.load().config.clone();
            let wanted: BTreeMap<&String, &Discover> = config
                .upstreams
                .iter()
                .filter_map(|u| Some((&u.name, u.discover.as_ref()?)))
                .collect();
            tasks.retain(|name, (spec, task)| {
                let keep = wanted.get(name) == Some(&&*spec);
                if !keep {
                    task.abort();
                }
                keep
            });
            for (name, spec) in wanted {
                if tasks.contains_key(name) {
                    continue;
                }
                let pool = Pool {
                    applier: applier.clone(),
                    metrics: metrics.clone(),
                    upstream: name.clone(),
                    spec: spec.clone(),
                    last: None,
                    failing: false,
                    retry: MIN_WAIT,
                };
                let task = tokio::spawn(pool.run(first_round.clone()));
                tasks.insert(name.clone(), (spec.clone(), task));
            }
            // Only the pools of the config at start hold the start up.
            first_round = None;
        }
        tokio::time::sleep(SNAPSHOT_POLL).await;
    }
}

/// One discovered pool.
struct Pool {
    applier: Applier,
    metrics: Arc<ClusterMetrics>,
    upstream: String,
    spec: Discover,
    /// The servers of the last answer applied.
    last: Option<Vec<UpstreamServer>>,
    /// The last lookup failed (logged once per run of failures).
    failing: bool,
    /// The wait after the next failed lookup (bounded by `interval`).
    retry: Duration,
}

impl Pool {
    async fn run(mut self, mut first_round: Option<std::sync::mpsc::Sender<()>>) {
        let mut resolver = None;
        loop {
            let wait = match &resolver {
                Some(resolver) => self.round(resolver).await,
                // Built once it can be: the system's DNS settings may be unreadable for a
                // while (resolv.conf not written yet at boot), which is retried as a
                // failed lookup is, not left until the next config change.
                None => match dns::resolver(&self.spec) {
                    Ok(built) => {
                        let wait = self.round(&built).await;
                        resolver = Some(built);
                        wait
                    }
                    Err(e) => self.retry_after(&e),
                },
            };
            if let Some(done) = first_round.take() {
                let _ = done.send(());
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One lookup and what follows from it; returns the wait until the next.
    async fn round(&mut self, resolver: &TokioResolver) -> Duration {
        let lookup = tokio::time::timeout(self.spec.timeout, dns::lookup(resolver, &self.spec));
        let answer = match lookup.await {
            Ok(Ok(answer)) if !answer.servers.is_empty() => answer,
            Ok(Ok(_)) => return self.retry_after("the answer has no addresses"),
            Ok(Err(e)) => return self.retry_after(&e),
            Err(_) => return self.retry_after("no answer within the discover timeout"),
        };
        if self.failing {
            tracing::info!(upstream = %self.upstream, name = %self.spec.name, "discovery: DNS answers again");
            self.failing = false;
        }
        self.retry = MIN_WAIT;
        let changed = self.last.as_ref() != Some(&answer.servers);
        if changed {
            self.apply(answer.servers.clone());
        }
        let servers = self.last.as_ref().map_or(0, Vec::len);
        self.metrics.lookup(
            &self.upstream,
            true,
            servers,
            changed && self.last.is_some(),
        );
        if self.spec.respect_ttl {
            answer.ttl.clamp(MIN_WAIT, self.spec.interval.max(MIN_WAIT))
        } else {
            self.spec.interval
        }
    }

    fn apply(&mut self, servers: Vec<UpstreamServer>) {
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        match self
            .applier
            .discovered(&self.upstream, &self.spec, servers.clone())
        {
            Ok(Some(changes)) => {
                let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
                tracing::info!(upstream = %self.upstream, servers = ?names, changes = ?changes, "discovery: servers changed");
                self.last = Some(servers);
            }
            // The pool was removed or changed meanwhile; the supervisor ends this task.
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(upstream = %self.upstream, error = %e, "discovery: the new servers cannot be applied; keeping the last")
            }
        }
    }

    /// A lookup failed: the wait until the next, shorter than `interval` while the
    /// failures are few.
    fn retry_after(&mut self, error: &str) -> Duration {
        self.failed(error);
        let wait = self.retry.min(self.spec.interval);
        self.retry = (self.retry * 2).min(self.spec.interval);
        wait
    }

    fn failed(&mut self, error: &str) {
        let kept = self.last.as_ref().map_or(0, Vec::len);
        self.metrics.lookup(&self.upstream, false, kept, false);
        if !self.failing {
            tracing::warn!(upstream = %self.upstream, name = %self.spec.name, error, kept, "discovery: DNS lookup failed; keeping the last servers");
            self.failing = true;
        }
    }
}
