//! A memory store: entries by key (a `BTreeMap`, so a prefix is a range), each key with
//! its variants (`Vary`), the least recently used key evicted first once the store's bytes
//! pass `max_size`. One mutex per store, held for a map operation and never across an
//! await; a hit takes an `Arc` of the entry and shares its body (`Bytes`), nothing copied.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_cache_semantics::CachePolicy;
use tokio::sync::watch;
use weir_config::CacheStore;

/// Most variants (`Vary`) kept under one key; the oldest goes first.
const MAX_VARIANTS: usize = 8;

/// What a key's bookkeeping costs beyond its bodies and heads (an estimate).
const ENTRY_OVERHEAD: u64 = 256;

/// A cached response: its policy (the request and response heads it was stored for) and
/// its body.
pub struct Entry {
    pub policy: CachePolicy,
    /// The stored response's status and end-to-end fields (what a stale answer sends).
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    /// How it may be served once stale.
    pub staleness: super::Staleness,
    pub body: Bytes,
    /// The values of the request fields the response varies on (`Vary`), joined: which
    /// variant of its key it is.
    pub variant: Vec<u8>,
    /// Bytes the entry accounts for.
    pub size: u64,
}

/// The store's counts, read by the metrics and the admin API.
#[derive(Default)]
pub struct Counts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bypasses: AtomicU64,
    /// Misses that waited for another request's fetch of their key.
    pub collapsed: AtomicU64,
    /// Stale entries served.
    pub stale: AtomicU64,
    /// Misses that revalidate a stale entry (a conditional request upstream).
    pub revalidations: AtomicU64,
    pub stores: AtomicU64,
    pub evictions: AtomicU64,
    pub bytes: AtomicU64,
    pub entries: AtomicU64,
}

/// An in-memory cache store, shared by all workers.
pub struct MemoryStore {
    pub config: CacheStore,
    pub counts: Counts,
    inner: Mutex<Lru>,
    /// The keys a miss is being fetched for (collapsed forwarding): the leader holds the
    /// sender, followers wait for it to close.
    pending: Mutex<HashMap<Box<[u8]>, watch::Sender<()>>>,
}

/// Who fetches a key that has no fresh entry.
pub enum Turn {
    /// This request: the others wait for it until [`MemoryStore::release`].
    Lead,
    /// Another request does: closed once it is done.
    Wait(watch::Receiver<()>),
}

#[derive(Default)]
struct Lru {
    keys: BTreeMap<Box<[u8]>, Slot>,
    /// Use order: the tick of each key's last use.
    order: BTreeMap<u64, Box<[u8]>>,
    tick: u64,
    bytes: u64,
}

struct Slot {
    variants: Vec<Arc<Entry>>,
    tick: u64,
}

impl Slot {
    fn size(&self) -> u64 {
        self.variants.iter().map(|e| e.size).sum()
    }
}

impl MemoryStore {
    pub fn new(config: CacheStore) -> MemoryStore {
        MemoryStore {
            config,
            counts: Counts::default(),
            inner: Mutex::new(Lru::default()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this miss of `key` fetches it, or waits for the one that does.
    pub fn turn(&self, key: &[u8]) -> Turn {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leader) = pending.get(key) {
            return Turn::Wait(leader.subscribe());
        }
        pending.insert(key.into(), watch::Sender::new(()));
        Turn::Lead
    }

    /// The leader of `key` is done (stored, or not): its followers look again.
    pub fn release(&self, key: &[u8]) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // Dropping the sender wakes the followers.
        pending.remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding it leaves a consistent map (each step completes).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The variants stored under `key` (marked as used), newest first.
    pub fn get(&self, key: &[u8]) -> Vec<Arc<Entry>> {
        let mut lru = self.lock();
        let tick = lru.next_tick();
        let Some(slot) = lru.keys.get_mut(key) else {
            return Vec::new();
        };
        let old = std::mem::replace(&mut slot.tick, tick);
        let variants = slot.variants.clone();
        if let Some(k) = lru.order.remove(&old) {
            lru.order.insert(tick, k);
        }
        variants
    }

    /// Stores `entry` under `key`, in place of the variant it replaces; evicts the least
    /// recently used keys past `max_size`.
    pub fn insert(&self, key: &[u8], entry: Entry) {
        let entry = Arc::new(entry);
        let mut lru = self.lock();
        let tick = lru.next_tick();
        let size = entry.size;
        let slot = match lru.keys.get_mut(key) {
            Some(slot) => {
                let old = std::mem::replace(&mut slot.tick, tick);
                let before = slot.size();
                slot.variants.retain(|e| e.variant != entry.variant);
                slot.variants.insert(0, entry);
                slot.variants.truncate(MAX_VARIANTS);
                let after = slot.size();
                lru.bytes = lru.bytes - before + after;
                let k = lru.order.remove(&old).unwrap_or_else(|| key.into());
                lru.order.insert(tick, k);
                None
            }
            None => Some(Slot {
                variants: vec![entry],
                tick,
            }),
        };
        if let Some(slot) = slot {
            lru.keys.insert(key.into(), slot);
            lru.order.insert(tick, key.into());
            lru.bytes += size + ENTRY_OVERHEAD;
        }
        let evicted = lru.evict_past(self.config.max_size);
        self.counts.evictions.fetch_add(evicted, Relaxed);
        self.publish(&lru);
    }

    /// Removes `key`, or every key starting with it when `prefix`; returns how many.
    pub fn purge(&self, key: &[u8], prefix: bool) -> u64 {
        let mut lru = self.lock();
        let doomed: Vec<Box<[u8]>> = match prefix {
            false => lru
                .keys
                .get_key_value(key)
                .map(|(k, _)| k.clone())
                .into_iter()
                .collect(),
            true => (lru
                .keys
                .range::<[u8], _>((std::ops::Bound::Included(key), std::ops::Bound::Unbounded)))
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(key))
            .cloned()
            .collect(),
        };
        for k in &doomed {
            lru.remove(k);
        }
        self.publish(&lru);
        doomed.len() as u64
    }

    fn publish(&self, lru: &Lru) {
        self.counts.bytes.store(lru.bytes, Relaxed);
        self.counts.entries.store(lru.keys.len() as u64, Relaxed);
    }
}

impl Lru {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(slot) = self.keys.remove(key) {
            self.order.remove(&slot.tick);
            self.bytes -= slot.size() + ENTRY_OVERHEAD;
        }
    }

    /// Evicts least recently used keys until the bytes are within `max`; returns how many.
    fn evict_past(&mut self, max: u64) -> u64 {
        let mut evicted = 0;
        while self.bytes > max {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            if let Some(slot) = self.keys.remove(&key) {
                self.bytes -= slot.size() + ENTRY_OVERHEAD;
                evicted += 1;
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn entry(size: usize, variant: &[u8]) -> Entry {
        let req = http::Request::get("http://a/").body(()).unwrap();
        let res = http::Response::builder().status(200).body(()).unwrap();
        let policy = CachePolicy::new(&req, &res);
        Entry {
            staleness: crate::cache::Staleness::of(&policy, res.headers(), SystemTime::now()),
            status: res.status(),
            headers: res.headers().clone(),
            policy,
            body: Bytes::from(vec![b'x'; size]),
            variant: variant.to_vec(),
            size: size as u64,
        }
    }

    fn store(max: u64) -> MemoryStore {
        MemoryStore::new(CacheStore {
            name: "t".into(),
            kind: weir_config::CacheKind::Memory,
            max_size: max,
            max_object_size: max,
        })
    }

    #[test]
    fn the_least_recently_used_key_goes_first() {
        let s = store(3 * (1000 + ENTRY_OVERHEAD));
        for k in [b"a", b"b", b"c"] {
            s.insert(k, entry(1000, b""));
        }
        assert_eq!(s.get(b"a").len(), 1); // a is now the newest
        s.insert(b"d", entry(1000, b""));
        assert!(s.get(b"b").is_empty(), "b was the least recently used");
        assert_eq!(s.get(b"a").len(), 1);
        assert_eq!(s.counts.evictions.load(Relaxed), 1);
        assert_eq!(s.counts.entries.load(Relaxed), 3);
        assert_eq!(s.counts.bytes.load(Relaxed), 3 * (1000 + ENTRY_OVERHEAD));
    }

    #[test]
    fn variants_replace_their_own_and_purge_takes_a_prefix() {
        let s = store(1 << 20);
        s.insert(b"http://h/a", entry(10, b"gzip"));
        s.insert(b"http://h/a", entry(20, b""));
        s.insert(b"http://h/a", entry(30, b"gzip"));
        let got = s.get(b"http://h/a");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].size, 30);
        s.insert(b"http://h/ab", entry(1, b""));
        s.insert(b"http://h/b", entry(1, b""));
        assert_eq!(s.purge(b"http://h/a", false), 1);
        assert_eq!(s.purge(b"http://h/a", true), 1);
        assert_eq!(s.counts.entries.load(Relaxed), 1);
        assert_eq!(s.counts.bytes.load(Relaxed), 1 + ENTRY_OVERHEAD);
    }
}
