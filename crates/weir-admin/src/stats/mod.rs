//! The dashboard's numbers: every `[admin] dashboard_interval` the admin side reads the
//! metric shards (`weir_core::metrics::totals`, the walk a scrape does) and keeps each
//! object's difference from the sample before, for `dashboard_history` (`ring`).
//! `GET /api/v1/stats` turns them into request and error rates and latency percentiles,
//! now and over time (`json`). The workers do nothing for it: they count as they always
//! do, and a dashboard that is off (`dashboard = false`) samples nothing.
//!
//! The sampler is a task on the admin runtime; each sample runs on the blocking pool, as
//! API requests do, so the admin thread stays free for the probes.

mod json;
pub(crate) mod ring;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;
use weir_core::metrics::totals::{totals, Totals};
use weir_core::Proxy;

use crate::store::Store;
use ring::{Count, Key, Ring};

/// The samples of the running proxy.
#[derive(Default)]
pub struct Stats {
    ring: Mutex<Ring>,
}

impl Stats {
    /// Takes a sample of `proxy`'s metrics, if the dashboard is on.
    pub fn sample(&self, proxy: &Proxy) {
        let settings = proxy.config().admin.dashboard;
        let counts = settings.map(|_| {
            let snapshot = proxy.snapshot();
            counts(&snapshot.config, totals(&proxy.metrics(), &snapshot))
        });
        let mut ring = self.lock();
        ring.configure(settings);
        if let Some(counts) = counts {
            ring.record(counts, Instant::now(), unix_ms());
        }
    }

    /// `GET /api/v1/stats?since=SEQ`: the objects of `proxy`'s running config with their
    /// numbers, series points after `since` only. `None` when the dashboard is off.
    pub fn to_json(&self, proxy: &Proxy, since: u64) -> Option<serde_json::Value> {
        let settings = proxy.config().admin.dashboard?;
        let mut ring = self.lock();
        // Before the sampler's first tick under these settings: no samples yet.
        ring.configure(Some(settings));
        Some(json::stats(&ring, proxy, since))
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Samples `store`'s proxy every `dashboard_interval` until `stopped`. While the dashboard
/// is off it does not wake up at all: it frees the samples and waits for the next config
/// change (a reload may turn it on, off, or change its interval).
pub async fn run(store: Arc<Store>, mut stopped: watch::Receiver<bool>) {
    let mut changes = store.subscribe();
    loop {
        changes.mark_unchanged();
        let wait = match store.proxy().config().admin.dashboard {
            Some(settings) => tokio::time::sleep(settings.interval),
            None => {
                store.stats.sample(store.proxy());
                tokio::select! {
                    _ = changes.changed() => continue,
                    _ = stopped.changed() => return,
                }
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = stopped.changed() => return,
        }
        let store = store.clone();
        let sampled = tokio::task::spawn_blocking(move || store.stats.sample(store.proxy()));
        if let Err(e) = sampled.await {
            tracing::error!(error = %e, "dashboard sample failed");
        }
    }
}

/// The totals of a snapshot's objects, by name.
fn counts(config: &weir_config::Config, totals: Totals) -> HashMap<Key, Count> {
    let mut counts = HashMap::new();
    for (l, t) in config.listeners.iter().zip(totals.listeners) {
        for (ri, traffic) in t.routes.into_iter().enumerate() {
            let route = ri.checked_sub(1).map(|r| l.routes[r].name.clone());
            let key = Key::Route(l.name.clone(), route);
            counts.insert(
                key,
                Count {
                    traffic,
                    ..Count::default()
                },
            );
        }
        let count = Count {
            traffic: t.traffic,
            connections: t.connections,
            open: t.active,
            http2: t.http2,
            ..Count::default()
        };
        counts.insert(Key::Listener(l.name.clone()), count);
    }
    for (u, t) in config.upstreams.iter().zip(totals.upstreams) {
        for (s, st) in u.servers.iter().zip(t.servers) {
            let count = Count {
                traffic: st.traffic,
                open: st.in_flight,
                connect_errors: st.connect_errors,
                ..Count::default()
            };
            counts.insert(Key::Server(u.name.clone(), s.name.clone()), count);
        }
        let count = Count {
            traffic: t.traffic,
            ..Count::default()
        };
        counts.insert(Key::Upstream(u.name.clone()), count);
    }
    counts
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
