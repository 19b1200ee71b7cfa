//! Every metric Weir exports: names, help texts, labels, and the scrape that merges the
//! per-worker shards into Prometheus text format (via `prometheus-client`).
//!
//! Counting happens in `shard` (one shard per worker, single writer). The scrape walks the
//! shards of all workers, adds them up, and labels them with names from the config, so label
//! values are always bounded: listener, route, upstream and server names from the config,
//! methods from a fixed set, status codes.

mod cache;
pub mod cluster;
mod encode;
pub mod etcd;
pub mod layout;
pub mod process;
pub mod shard;
mod slots;
pub mod totals;
mod view;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use shard::{AbortReason, DefaultReason, WorkerMetrics};

/// The process-wide view: every worker's shard plus the few process-level counters.
#[derive(Debug, Default)]
pub struct Metrics {
    shards: Mutex<Vec<Arc<WorkerMetrics>>>,
    /// Access-log lines dropped because the writer fell behind.
    pub access_log_dropped: Arc<AtomicU64>,
    /// A fleet member's view of etcd.
    pub etcd: Arc<etcd::EtcdMetrics>,
    /// Redis syncs and DNS discovery (the cluster thread).
    pub cluster: Arc<cluster::ClusterMetrics>,
}

impl Metrics {
    /// Registers a worker's shard (called once per worker at start).
    pub fn add_shard(&self, shard: Arc<WorkerMetrics>) {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(shard);
    }

    /// The current shards (a scrape-time copy of the list, not of the counters).
    pub fn shards(&self) -> Vec<Arc<WorkerMetrics>> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn dropped_log_lines(&self) -> u64 {
        self.access_log_dropped.load(Ordering::Relaxed)
    }
}

pub use encode::encode_text;

impl Metrics {
    /// Gives every worker's shard the slots of a config about to be published.
    pub fn fill(&self, slots: &layout::SlotMap) {
        for shard in self.shards() {
            shard.fill(slots);
        }
    }

    /// Zeroes server slot `server` of upstream slot `upstream` in every worker's shard.
    pub fn zero_server(&self, upstream: usize, server: usize) {
        for shard in self.shards() {
            if let Some(m) = shard.server(upstream, server) {
                m.zero();
            }
        }
    }
}
