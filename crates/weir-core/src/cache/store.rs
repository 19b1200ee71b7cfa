//! A cache store, shared by all workers of the process: an index ([`Lru`]: entries by key
//! and variant, least recently used key evicted first once the bytes pass `max_size`)
//! behind one mutex, held for a map operation and never across an await or a file's I/O.
//!
//! - `kind = "memory"`: an entry's body is in memory (`Bytes`): a hit shares it, nothing
//!   copied.
//! - `kind = "disk"`: an entry's body is in its file ([`Disk`]); the index (heads, policies,
//!   where each body is) is in memory, rebuilt from the files at start by a background
//!   scan, so entries are found again after a restart. Files are written, and large bodies
//!   read, on the runtime's blocking pool ([`Store::put`], [`Store::body`]); a body
//!   of at most [`SYNC_READ_MAX`] is read in one go where the hit is looked up
//!   ([`Store::body_now`]). A file that cannot be read back whole is dropped from the index
//!   and removed: a miss, a log line and `weir_cache_errors_total`, never an error to the
//!   client. Several processes may share a directory for a while (a binary upgrade): each
//!   indexes what it wrote and found at start, and a file the other replaced or removed is
//!   a miss.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_cache_semantics::CachePolicy;
use tokio::sync::watch;
use weir_config::{CacheKind, CacheStore};

use super::disk::{Disk, Found, Location, Meta};
use super::lru::Lru;

/// The largest body a hit reads from its file at once, where it is looked up (from the
/// page cache, microseconds); larger ones are read on the blocking pool.
pub const SYNC_READ_MAX: u64 = 64 << 10;

/// A cached response: its policy (the request and response heads it was stored for) and
/// its body.
pub struct Entry {
    pub policy: CachePolicy,
    /// The stored response's status and end-to-end fields (what a stale answer sends).
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    /// How it may be served once stale.
    pub staleness: super::Staleness,
    pub body: Body,
    /// The values of the request fields the response varies on (`Vary`), joined: which
    /// variant of its key it is.
    pub variant: Vec<u8>,
    /// Bytes the entry accounts for (a disk entry: its file's length).
    pub size: u64,
}

/// Where an entry's body is.
pub enum Body {
    Memory(Bytes),
    Disk(Location),
}

impl Body {
    /// The body's length in bytes.
    pub fn length(&self) -> u64 {
        match self {
            Body::Memory(b) => b.len() as u64,
            Body::Disk(at) => at.body_len(),
        }
    }
}

/// A body as [`Store::body_now`] has it.
pub enum Ready {
    Now(Bytes),
    /// On disk and large: [`Store::body`] reads it on the blocking pool.
    Later,
    /// Its file could not be read: the entry is gone (a miss).
    Gone,
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
    /// A disk store's files that could not be written, or read back whole.
    pub errors: AtomicU64,
    pub bytes: AtomicU64,
    pub entries: AtomicU64,
}

/// A cache store, shared by all workers.
pub struct Store {
    pub config: CacheStore,
    pub counts: Counts,
    inner: Mutex<Lru>,
    /// The keys a miss is being fetched for (collapsed forwarding): the leader holds the
    /// sender, followers wait for it to close.
    pending: Mutex<HashMap<Box<[u8]>, watch::Sender<()>>>,
    disk: Option<Disk>,
    /// A disk store's scan of its files is still running.
    pub loading: AtomicBool,
}

/// Who fetches a key that has no fresh entry.
pub enum Turn {
    /// This request: the others wait for it until [`Store::release`].
    Lead,
    /// Another request does: closed once it is done.
    Wait(watch::Receiver<()>),
}

impl Store {
    /// The store `config` describes; a disk store starts scanning its directory (in a
    /// thread of its own: the store answers at once, finding more entries as it goes).
    pub fn open(config: CacheStore) -> Arc<Store> {
        let disk = match &config.kind {
            CacheKind::Memory => None,
            CacheKind::Disk { path } => Some(Disk::new(path.clone())),
        };
        let store = Arc::new(Store {
            loading: AtomicBool::new(disk.is_some()),
            config,
            counts: Counts::default(),
            inner: Mutex::new(Lru::default()),
            pending: Mutex::new(HashMap::new()),
            disk,
        });
        if store.disk.is_some() {
            let scanning = store.clone();
            let spawned = std::thread::Builder::new()
                .name("weir-cache-scan".into())
                .spawn(move || scanning.scan());
            if let Err(e) = spawned {
                tracing::error!(store = %store.config.name, error = %e, "cache scan not started");
                store.loading.store(false, Relaxed);
            }
        }
        store
    }

    /// Indexes the entries of a disk store's files.
    fn scan(&self) {
        let Some(disk) = &self.disk else { return };
        let started = Instant::now();
        if let Err(e) = std::fs::create_dir_all(disk.dir()) {
            tracing::error!(store = %self.config.name, dir = %disk.dir().display(), error = %e,
                "cache directory cannot be made: nothing will be stored");
        }
        let now = SystemTime::now();
        let scanned = disk.scan(|found| {
            let key = found.key.clone();
            self.insert(&key, Entry::found(found, now), true);
        });
        self.counts.errors.fetch_add(scanned.discarded, Relaxed);
        self.loading.store(false, Relaxed);
        tracing::info!(store = %self.config.name, entries = scanned.found,
            discarded = scanned.discarded, abandoned_writes = scanned.abandoned,
            ms = started.elapsed().as_millis() as u64, "cache store loaded");
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
        self.lock().get(key)
    }

    /// Stores `entry` (its body in memory) under `key`: a memory store at once, a disk
    /// store once its file is written (on the blocking pool). `release`: the fetch of
    /// `key` is over once it is stored ([`Store::release`]), so that waiting requests
    /// find it.
    pub fn put(self: &Arc<Self>, key: Vec<u8>, entry: Entry, release: bool) {
        if self.disk.is_none() {
            self.insert(&key, entry, false);
            self.counts.stores.fetch_add(1, Relaxed);
            if release {
                self.release(&key);
            }
            return;
        }
        let store = self.clone();
        let job = move || {
            store.write(&key, entry);
            if release {
                store.release(&key);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(job)),
            Err(_) => job(),
        }
    }

    /// Writes `entry` to its file and indexes it there.
    fn write(&self, key: &[u8], mut entry: Entry) {
        let (Some(disk), Body::Memory(body)) = (&self.disk, &entry.body) else {
            return;
        };
        let meta = Meta {
            variant: &entry.variant,
            policy: &entry.policy,
            status: entry.status,
            headers: &entry.headers,
        };
        match disk.write(key, meta, body) {
            Ok(at) => {
                entry.size = at.file_len;
                entry.body = Body::Disk(at);
                self.insert(key, entry, false);
                self.counts.stores.fetch_add(1, Relaxed);
            }
            Err(e) => {
                self.counts.errors.fetch_add(1, Relaxed);
                tracing::warn!(store = %self.config.name, error = %e, "cache entry not written");
            }
        }
    }

    /// Indexes `entry` under `key` (`only_new`: unless that variant is there) and evicts
    /// the least recently used keys past `max_size`.
    fn insert(&self, key: &[u8], entry: Entry, only_new: bool) {
        let mut lru = self.lock();
        let mut gone = lru.insert(key, Arc::new(entry), only_new);
        let (evicted, more) = lru.evict_past(self.config.max_size);
        gone.extend(more);
        self.publish(&lru);
        drop(lru);
        self.counts.evictions.fetch_add(evicted, Relaxed);
        self.remove_files(&gone);
    }

    /// Removes `key`, or every key starting with it when `prefix`; returns how many.
    pub fn purge(&self, key: &[u8], prefix: bool) -> u64 {
        let mut lru = self.lock();
        let doomed = match prefix {
            false => vec![key.into()],
            true => lru.prefixed(key),
        };
        let mut gone = Vec::new();
        let mut purged = 0;
        for k in &doomed {
            let variants = lru.remove(k);
            purged += u64::from(!variants.is_empty());
            gone.extend(variants);
        }
        self.publish(&lru);
        drop(lru);
        self.remove_files(&gone);
        purged
    }

    /// The body of `entry` (of `key`), if it can be had without waiting.
    pub fn body_now(&self, key: &[u8], entry: &Arc<Entry>) -> Ready {
        match (&entry.body, &self.disk) {
            (Body::Memory(body), _) => Ready::Now(body.clone()),
            (Body::Disk(at), Some(disk)) if at.body_len() <= SYNC_READ_MAX => {
                match disk.read(at, key) {
                    Ok(body) => Ready::Now(body),
                    Err(e) => {
                        self.discard(key, entry, &e);
                        Ready::Gone
                    }
                }
            }
            (Body::Disk(_), Some(_)) => Ready::Later,
            (Body::Disk(_), None) => Ready::Gone,
        }
    }

    /// The body of `entry` (of `key`): [`Store::body_now`], or read on the blocking pool
    /// when it is large; `None` if its file could not be read (the entry is gone then).
    pub async fn body(self: &Arc<Self>, key: &[u8], entry: &Arc<Entry>) -> Option<Bytes> {
        let at = match (self.body_now(key, entry), &entry.body) {
            (Ready::Now(body), _) => return Some(body),
            (Ready::Later, Body::Disk(at)) => *at,
            _ => return None,
        };
        let store = self.clone();
        let owned = key.to_vec();
        let read = tokio::task::spawn_blocking(move || {
            let disk = store.disk.as_ref().ok_or(std::io::ErrorKind::NotFound)?;
            disk.read(&at, &owned)
        });
        match read.await {
            Ok(Ok(body)) => Some(body),
            Ok(Err(e)) => {
                self.discard(key, entry, &e);
                None
            }
            Err(_) => None,
        }
    }

    /// Drops `entry` of `key`, whose file could not be read back (`error`), and its file.
    fn discard(&self, key: &[u8], entry: &Arc<Entry>, error: &std::io::Error) {
        let mut lru = self.lock();
        let removed = lru.remove_entry(key, entry);
        self.publish(&lru);
        drop(lru);
        if removed {
            self.counts.errors.fetch_add(1, Relaxed);
            tracing::warn!(store = %self.config.name, key = %String::from_utf8_lossy(key),
                error = %error, "cache entry unreadable: dropped");
            self.remove_files(std::slice::from_ref(entry));
        }
    }

    /// Removes the files of entries the index let go.
    fn remove_files(&self, gone: &[Arc<Entry>]) {
        let Some(disk) = &self.disk else { return };
        for entry in gone {
            if let Body::Disk(at) = &entry.body {
                disk.remove(at);
            }
        }
    }

    fn publish(&self, lru: &Lru) {
        self.counts.bytes.store(lru.bytes, Relaxed);
        self.counts.entries.store(lru.len() as u64, Relaxed);
    }
}

impl Entry {
    /// The index entry of a file the scan found (`now`: when it was found).
    fn found(found: Found, now: SystemTime) -> Entry {
        Entry {
            staleness: super::Staleness::of(&found.policy, &found.headers, now),
            policy: found.policy,
            status: found.status,
            headers: found.headers,
            size: found.location.file_len,
            body: Body::Disk(found.location),
            variant: found.variant,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::lru::ENTRY_OVERHEAD;
    use super::*;

    fn entry(size: usize, variant: &[u8]) -> Entry {
        let req = http::Request::get("http://a/").body(()).unwrap();
        let res = http::Response::builder().status(200).body(()).unwrap();
        let policy = CachePolicy::new(&req, &res);
        Entry {
            staleness: crate::cache::Staleness::of(&policy, res.headers(), SystemTime::now()),
            status: res.status(),
            headers: res.headers().clone(),
            policy,
            body: Body::Memory(Bytes::from(vec![b'x'; size])),
            variant: variant.to_vec(),
            size: size as u64,
        }
    }

    fn config(max: u64, kind: CacheKind) -> CacheStore {
        CacheStore {
            name: "t".into(),
            kind,
            max_size: max,
            max_object_size: max,
        }
    }

    fn store(max: u64) -> Arc<Store> {
        Store::open(config(max, CacheKind::Memory))
    }

    #[test]
    fn the_least_recently_used_key_goes_first() {
        let s = store(3 * (1000 + ENTRY_OVERHEAD));
        for k in [b"a", b"b", b"c"] {
            s.insert(k, entry(1000, b""), false);
        }
        assert_eq!(s.get(b"a").len(), 1); // a is now the newest
        s.insert(b"d", entry(1000, b""), false);
        assert!(s.get(b"b").is_empty(), "b was the least recently used");
        assert_eq!(s.get(b"a").len(), 1);
        assert_eq!(s.counts.evictions.load(Relaxed), 1);
        assert_eq!(s.counts.entries.load(Relaxed), 3);
        assert_eq!(s.counts.bytes.load(Relaxed), 3 * (1000 + ENTRY_OVERHEAD));
    }

    #[test]
    fn variants_replace_their_own_and_purge_takes_a_prefix() {
        let s = store(1 << 20);
        s.insert(b"http://h/a", entry(10, b"gzip"), false);
        s.insert(b"http://h/a", entry(20, b""), false);
        s.insert(b"http://h/a", entry(30, b"gzip"), false);
        let got = s.get(b"http://h/a");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].size, 30);
        s.insert(b"http://h/ab", entry(1, b""), false);
        s.insert(b"http://h/b", entry(1, b""), false);
        assert_eq!(s.purge(b"http://h/a", false), 1);
        assert_eq!(s.purge(b"http://h/a", true), 1);
        assert_eq!(s.counts.entries.load(Relaxed), 1);
        assert_eq!(s.counts.bytes.load(Relaxed), 1 + ENTRY_OVERHEAD);
    }

    /// Polls (the scan runs in its own thread) until the store has loaded.
    fn loaded(s: &Store) {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while s.loading.load(Relaxed) {
            assert!(Instant::now() < deadline, "the scan hangs");
            std::thread::yield_now();
        }
    }

    fn files(dir: &std::path::Path) -> (usize, u64) {
        let all = std::fs::read_dir(dir).unwrap().flatten();
        let inner = all.flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten());
        inner.fold((0, 0), |(n, bytes), f| {
            (n + 1, bytes + f.metadata().unwrap().len())
        })
    }

    #[test]
    fn a_disk_store_keeps_its_files_within_max_size_and_finds_them_again() {
        let dir = std::env::temp_dir().join(format!("weir-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let kind = CacheKind::Disk { path: dir.clone() };
        let s = Store::open(config(20_000, kind.clone()));
        loaded(&s);
        for i in 0..10 {
            // No runtime here: each file is written before `put` returns.
            s.put(
                format!("http://h/{i}").into_bytes(),
                entry(4000, b""),
                false,
            );
        }
        let (count, bytes) = files(&dir);
        assert!(bytes <= 20_000, "{bytes} bytes in {count} files");
        assert_eq!(count as u64, s.counts.entries.load(Relaxed));
        assert!(s.counts.evictions.load(Relaxed) >= 6);
        let newest = s.get(b"http://h/9");
        let Ready::Now(body) = s.body_now(b"http://h/9", &newest[0]) else {
            panic!("a small body is read at once");
        };
        assert_eq!(body.len(), 4000);
        assert_eq!(s.purge(b"http://h/9", false), 1);
        assert_eq!(files(&dir).0, count - 1);

        let again = Store::open(config(20_000, kind));
        loaded(&again);
        assert_eq!(again.counts.entries.load(Relaxed), count as u64 - 1);
        assert_eq!(again.get(b"http://h/8").len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
