//! Process-level metrics of the fleet features (`cluster`): the Redis syncs of shared rate
//! limits and DNS discovery. Written by the cluster thread (a short lock per sync or
//! lookup, never on the request path) and read by the scrape; labelled by the names of
//! `[cluster.redis.NAME]` and of upstreams, so bounded by the config.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct ClusterMetrics {
    redis: Mutex<BTreeMap<String, RedisStats>>,
    discovery: Mutex<BTreeMap<String, DiscoveryStats>>,
}

/// One `[cluster.redis.NAME]`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RedisStats {
    pub syncs_ok: u64,
    pub syncs_failed: u64,
    /// Whether the last sync succeeded.
    pub up: bool,
}

/// The discovery of one upstream.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct DiscoveryStats {
    pub lookups_ok: u64,
    pub lookups_failed: u64,
    /// Answers that changed the pool's servers.
    pub updates: u64,
    /// Servers in the pool now (the last answer kept).
    pub servers: u64,
    /// Unix time of the last successful lookup (0: none yet).
    pub last_success: f64,
}

impl ClusterMetrics {
    /// Counts a sync with Redis `name`.
    pub fn redis_sync(&self, name: &str, ok: bool) {
        let mut redis = lock(&self.redis);
        let stats = redis.entry(name.to_owned()).or_default();
        if ok {
            stats.syncs_ok += 1;
        } else {
            stats.syncs_failed += 1;
        }
        stats.up = ok;
    }

    /// Counts a lookup of `upstream`'s discovery; `servers`: the pool's size after it,
    /// `changed`: the answer changed the pool.
    pub fn lookup(&self, upstream: &str, ok: bool, servers: usize, changed: bool) {
        let mut discovery = lock(&self.discovery);
        let stats = discovery.entry(upstream.to_owned()).or_default();
        if ok {
            stats.lookups_ok += 1;
            stats.last_success = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
        } else {
            stats.lookups_failed += 1;
        }
        stats.updates += u64::from(changed);
        stats.servers = servers as u64;
    }

    pub fn redis(&self) -> BTreeMap<String, RedisStats> {
        lock(&self.redis).clone()
    }

    pub fn discovery(&self) -> BTreeMap<String, DiscoveryStats> {
        lock(&self.discovery).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
