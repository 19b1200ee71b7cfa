//! `weir_cache_*`: the HTTP cache's counts per store (`[caches.NAME]`), read from the
//! stores of the running snapshot at each scrape (each store counts in atomics shared by
//! all workers; `cache::store::Counts`).

use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{counter, gauge, Labels, Result};
use crate::cache::store::Counts;
use crate::snapshot::Snapshot;

/// The counts of one store, read once.
#[derive(Debug, Clone)]
pub(super) struct StoreRow {
    name: String,
    counters: [u64; COUNTERS.len()],
    bytes: u64,
    entries: u64,
    index_bytes: u64,
    filling: u64,
}

type PickCount = fn(&Counts) -> &std::sync::atomic::AtomicU64;

/// The counters: name, help, which count.
const COUNTERS: [(&str, &str, PickCount); 10] = [
    ("weir_cache_hits", "Requests answered from a fresh cache entry (collapsed waits answered from the entry included).", |c| &c.hits),
    ("weir_cache_misses", "Cacheable requests (GET, HEAD) with no fresh entry: forwarded upstream.", |c| &c.misses),
    ("weir_cache_revalidations", "Misses that revalidated a stale entry with a conditional request upstream.", |c| &c.revalidations),
    ("weir_cache_bypasses", "Requests of a caching route the cache does not serve (other methods, invalid fields), and responses not stored for being over max_object_size.", |c| &c.bypasses),
    ("weir_cache_collapsed_waits", "Misses that waited for another request's fetch of the same key (collapsed forwarding).", |c| &c.collapsed),
    ("weir_cache_stored", "Responses stored.", |c| &c.stores),
    ("weir_cache_evictions", "Keys evicted to stay within max_size.", |c| &c.evictions),
    ("weir_cache_stale", "Stale entries served (stale-while-revalidate, stale-if-error).", |c| &c.stale),
    ("weir_cache_errors", "A disk store's entries not written, or not read back whole (discarded), or not readable for now (kept): each a miss.", |c| &c.errors),
    ("weir_cache_fills_abandoned", "Misses whose response was not stored because the store's fills in flight held max_fill_memory (streamed to the client uncached).", |c| &c.fills_abandoned),
];

/// The rows of `snapshot`'s stores.
pub(super) fn rows(snapshot: &Snapshot) -> Vec<StoreRow> {
    snapshot
        .caches
        .iter()
        .map(|store| StoreRow {
            name: store.config.name.clone(),
            counters: COUNTERS.map(|(_, _, pick)| pick(&store.counts).load(Relaxed)),
            bytes: store.counts.bytes.load(Relaxed),
            entries: store.counts.entries.load(Relaxed),
            index_bytes: store.counts.index_bytes.load(Relaxed),
            filling: store.counts.filling.load(Relaxed),
        })
        .collect()
}

pub(super) fn encode(enc: &mut DescriptorEncoder, rows: &[StoreRow]) -> Result {
    let label = |row: &StoreRow| -> Labels { vec![("store", row.name.clone())] };
    for (i, (name, help, _)) in COUNTERS.iter().enumerate() {
        let values: Vec<(Labels, u64)> = rows.iter().map(|r| (label(r), r.counters[i])).collect();
        counter(enc, name, help, &values)?;
    }
    let gauge_of = |pick: fn(&StoreRow) -> u64| -> Vec<(Labels, i64)> {
        rows.iter().map(|r| (label(r), pick(r) as i64)).collect()
    };
    gauge(
        enc,
        "weir_cache_bytes",
        "Bytes the store's entries take (bodies, heads, keys).",
        &gauge_of(|r| r.bytes),
    )?;
    gauge(
        enc,
        "weir_cache_entries",
        "Keys in the store.",
        &gauge_of(|r| r.entries),
    )?;
    gauge(
        enc,
        "weir_cache_index_bytes",
        "Memory the store's index takes, estimated (bounded by index_size for a disk store; in weir_cache_bytes for a memory store).",
        &gauge_of(|r| r.index_bytes),
    )?;
    gauge(
        enc,
        "weir_cache_fill_bytes",
        "Memory the store's fills in flight hold (recorded bodies; bounded by max_fill_memory).",
        &gauge_of(|r| r.filling),
    )
}
