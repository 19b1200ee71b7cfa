//! The state of a fleet member's view of etcd (`[cluster] etcd`, weir-cluster): set by the
//! fleet's thread, read at scrape. All zero, and not exported, on an instance without etcd.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct EtcdMetrics {
    /// Set once the instance is a fleet member: the series below are exported.
    pub enabled: AtomicBool,
    /// The config revision (etcd revision of the last shared change) applied here.
    pub applied_revision: AtomicI64,
    /// The config revision this instance has seen (applied or rejected).
    pub seen_revision: AtomicI64,
    /// Unix time in milliseconds of the last successful exchange with etcd.
    pub last_contact_ms: AtomicU64,
    /// How often the lease is renewed, in milliseconds (contact is expected that often).
    pub lease_interval_ms: AtomicU64,
    /// Changes this instance did not apply (invalid here, or failed to apply).
    pub rejected: AtomicU64,
    /// Full re-reads of the shared objects (start, compaction, lost history).
    pub relists: AtomicU64,
}

impl EtcdMetrics {
    /// Records a successful exchange with etcd now.
    pub fn contact(&self) {
        self.last_contact_ms.store(unix_ms(), Relaxed);
    }

    /// Seconds since the last successful exchange with etcd (`None`: never).
    pub fn contact_age(&self) -> Option<f64> {
        let last = self.last_contact_ms.load(Relaxed);
        (last > 0).then(|| unix_ms().saturating_sub(last) as f64 / 1000.0)
    }

    pub fn lease_interval_s(&self) -> f64 {
        self.lease_interval_ms.load(Relaxed) as f64 / 1000.0
    }

    /// Applied everything seen, and heard from etcd within `max_age` seconds.
    pub fn in_sync(&self, max_age: f64) -> bool {
        self.applied_revision.load(Relaxed) == self.seen_revision.load(Relaxed)
            && self.contact_age().is_some_and(|age| age <= max_age)
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
