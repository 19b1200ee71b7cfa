//! A cache store, shared by all workers of the process: an index ([`Lru`]: entries by key
//! and variant, least recently used key evicted first once the bytes pass `max_size`)
//! behind one mutex, held for a map operation and never across an await or a file's I/O.
//!
//! - `kind = "memory"`: an entry's body is in memory (`Bytes`): a hit shares it, nothing
//!   copied. A body of at least `sendfile_min_size` is kept in a sealed memfd, its bytes
//!   mapped from it ([`Body::Sealed`]), so that plain-TCP HTTP/1.1 hits send it with
//!   sendfile(2) (`files::reply`), no copy into the socket; if the memfd cannot be had
//!   (out of descriptors or mappings) the body stays on the heap. The copy into the memfd
//!   is made on the runtime's blocking pool ([`Store::put`]), not on the worker.
//! - `kind = "disk"`: an entry's body is in its file ([`Disk`]); the index (heads, policies,
//!   where each body is) is in memory, rebuilt from the files at start by a background
//!   scan, so entries are found again after a restart. Files are written, and large
//!   bodies checked, on the runtime's blocking pool ([`Store::put`], [`Store::body`]); a
//!   file of at most [`SYNC_READ_MAX`] is read in one go where the hit is looked up
//!   ([`Store::body_now`]). Any other body (and one of at least `sendfile_min_size`)
//!   whose sum was checked in this process ([`Entry::checked`]; one the scan found is
//!   checked once, in pieces, by its first hit, which the others wait for) goes out as
//!   the entry's file, open ([`Held::File`]), whatever answers with it: a fresh hit, a
//!   stale entry a `304` confirmed (its refreshed file gets the body copied file to file:
//!   [`Store::put_refreshed`]) or that answers for a failure. No request reads a large
//!   body into memory: sendfile(2) sends it to plain-TCP HTTP/1.1 clients, the others
//!   read it in pieces as a static file's. A file that cannot be read back whole is
//!   dropped from the index and removed: a miss, a log line and `weir_cache_errors_total`,
//!   never an error to the client; a file that cannot be read at all for now (too many
//!   open files, EIO, EACCES) is a miss, logged and counted, and kept. Several processes
//!   may share a directory for a while (a binary upgrade): each indexes what it wrote and
//!   found at start, and a file the other replaced or removed is a miss (dropped from the
//!   index, the file left).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_cache_semantics::CachePolicy;
use tokio::sync::{watch, Notify};
use weir_config::{CacheKind, CacheStore};

use super::disk::{Disk, Found, Location, Meta, Unreadable, Written};
use super::lru::Lru;
use super::sealed::{self, Memfd};

/// The largest file (head part and body) a hit reads at once, where it is looked up (from
/// the page cache, microseconds); larger ones are read on the blocking pool.
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
    /// Bytes the entry accounts for (a disk entry: its file's length; a sealed body: its
    /// pages).
    pub size: u64,
    /// Bytes its index entry takes in memory (key, heads, policy; a memory store counts
    /// them in `size` too): a disk store's index is bounded by `index_size` with them.
    pub index: u64,
    /// A disk entry's body sum was checked in this process (it wrote the file, or copied
    /// it from a checked one, or read it whole since): its file may be sent as it is.
    /// Files the scan found are checked by their first hit ([`Store::body`]).
    pub checked: Checked,
}

/// Whether a disk entry's body sum was checked in this process, and its check if one is
/// under way. The scan reads only the head part of each file (its time is bounded by the
/// number of files, not their size), so a body that was damaged on disk (a bit flipped, a
/// block lost in a crash: no fsync) is only found by reading it: an unchecked file is
/// never sent as it is. A large one is checked once, on the blocking pool, in pieces
/// ([`Disk::check`]); the hits that come meanwhile wait for that check instead of each
/// reading the body (into memory, as they did: one copy per concurrent hit).
#[derive(Default)]
pub struct Checked {
    ok: AtomicBool,
    /// A check is running.
    running: AtomicBool,
    /// Woken when a check ends (well or not).
    done: Notify,
}

impl Checked {
    /// Checked (`true`: the bytes were just written or read whole), or not yet.
    pub fn new(ok: bool) -> Checked {
        Checked {
            ok: AtomicBool::new(ok),
            ..Checked::default()
        }
    }

    pub fn is_ok(&self) -> bool {
        self.ok.load(Acquire)
    }

    fn set_ok(&self) {
        self.ok.store(true, Release);
    }
}

/// A check under way: when it ends, however it ends (its job returned, panicked, or was
/// dropped unrun by a runtime shutting down), the next hit may check again and the hits
/// waiting for it go on; else they would wait forever.
struct CheckRun(Arc<Entry>);

impl Drop for CheckRun {
    fn drop(&mut self) {
        self.0.checked.running.store(false, Release);
        self.0.checked.done.notify_waiters();
    }
}

/// Where an entry's body is.
pub enum Body {
    Memory(Bytes),
    /// In a sealed memfd (a memory store's large body), `Bytes` mapped from it.
    Sealed(Bytes, Arc<Memfd>),
    Disk(Location),
}

impl Body {
    /// The body's length in bytes.
    pub fn length(&self) -> u64 {
        match self {
            Body::Memory(b) | Body::Sealed(b, _) => b.len() as u64,
            Body::Disk(at) => at.body_len(),
        }
    }

    /// The body as a reply holds it, if it is in memory.
    fn held(&self) -> Option<Held> {
        match self {
            Body::Memory(b) => Some(Held::Memory(b.clone())),
            Body::Sealed(b, file) => Some(Held::Sealed(b.clone(), file.clone())),
            Body::Disk(_) => None,
        }
    }
}

/// An entry's body as a reply holds it: what it sends from, kept while it sends (an entry
/// evicted or purged meanwhile is sent whole: its memory and its open file outlive it).
#[derive(Clone)]
pub enum Held {
    Memory(Bytes),
    /// In memory, mapped from this sealed memfd (sendfile's case).
    Sealed(Bytes, Arc<Memfd>),
    /// In a disk entry's file, open: `.2` bytes from byte `.1` (sendfile's case; read in
    /// pieces otherwise).
    File(Arc<File>, u64, u64),
}

impl Held {
    pub fn len(&self) -> u64 {
        match self {
            Held::Memory(b) | Held::Sealed(b, _) => b.len() as u64,
            Held::File(_, _, len) => *len,
        }
    }

    /// Whether it has no bytes (a HEAD's, or an empty body).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A body as [`Store::body_now`] has it.
pub enum Ready {
    Now(Held),
    /// On disk, large, and its sum not checked in this process yet: [`Store::body`] checks
    /// it on the blocking pool (once, whatever the requests waiting for it).
    Later,
    /// Its file could not be read: a miss (the entry dropped if the file is not whole or
    /// not its own any more).
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
    /// Bytes a disk store's index takes (estimated: [`Entry::index`]).
    pub index_bytes: AtomicU64,
    /// Bytes the fills in flight hold in memory now ([`FillMemory`]).
    pub filling: AtomicU64,
    /// Fills abandoned for `max_fill_memory` (their responses streamed on, uncached).
    pub fills_abandoned: AtomicU64,
}

/// The bytes one fill holds in memory (its recorded body's room), counted in its store's
/// [`Counts::filling`] until it is dropped: once the entry is stored (a disk store's file
/// written, a memory store's body sealed), or the fill is abandoned. All fills of a store
/// together stay within its `max_fill_memory`: one atomic add per growth of a body (its
/// room doubles), no lock.
pub struct FillMemory {
    store: Arc<Store>,
    bytes: u64,
}

impl FillMemory {
    pub fn new(store: &Arc<Store>) -> FillMemory {
        FillMemory {
            store: store.clone(),
            bytes: 0,
        }
    }

    /// Counts `more` bytes more, if the store's fills stay within `max_fill_memory`;
    /// `false` (nothing counted) if they would not.
    pub fn grow(&mut self, more: u64) -> bool {
        let bound = self.store.max_fill_memory.load(Relaxed);
        let filling = &self.store.counts.filling;
        let before = filling.fetch_add(more, Relaxed);
        if before.saturating_add(more) > bound {
            filling.fetch_sub(more, Relaxed);
            return false;
        }
        self.bytes += more;
        true
    }

    /// Lets all of its bytes go (the body was dropped).
    pub fn release(&mut self) {
        self.store.counts.filling.fetch_sub(self.bytes, Relaxed);
        self.bytes = 0;
    }

    /// The store the bytes are counted in.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

impl Drop for FillMemory {
    fn drop(&mut self) {
        self.release();
    }
}

/// A cache store, shared by all workers.
pub struct Store {
    /// Its name and kind; its sizes as it was opened with (a reload may change them since:
    /// [`Store::max_size`], [`Store::max_object_size`]).
    pub config: CacheStore,
    max_size: AtomicU64,
    max_object_size: AtomicU64,
    sendfile_min_size: AtomicU64,
    max_fill_memory: AtomicU64,
    index_size: AtomicU64,
    pub counts: Counts,
    inner: Mutex<Lru>,
    /// The keys a miss is being fetched for, each by a route's scope then the key
    /// ([`pending_key`]: routes sharing the store never wait for each other's fetch), for
    /// collapsed forwarding: the leader holds the sender, followers wait for it to close.
    pending: Mutex<HashMap<Box<[u8]>, watch::Sender<()>>>,
    disk: Option<Disk>,
    /// A disk store's scan of its files is still running (cleared with `Release`: read it
    /// with `Acquire`, [`Store::loading`]).
    loading: AtomicBool,
}

/// A [`Store::put`] on the blocking pool: releases the fetch of `key` by the routes of
/// scope `release` (if any) when dropped.
struct Putting {
    store: Arc<Store>,
    key: Vec<u8>,
    release: Option<Arc<[u8]>>,
    /// The fill's memory, let go once the entry is written or sealed.
    _memory: Option<FillMemory>,
}

impl Putting {
    /// Runs `job` (given the store and the key) on the blocking pool, or here when there
    /// is no runtime. The release is the guard's drop, after the job (or if it panics, or
    /// is dropped unrun at shutdown): the waiting requests are never left until
    /// `lock_timeout`.
    fn run(self, job: impl FnOnce(&Arc<Store>, &[u8]) + Send + 'static) {
        let task = move || {
            // The whole guard, dropped once the job is over.
            let putting = self;
            job(&putting.store, &putting.key[..]);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(task)),
            Err(_) => task(),
        }
    }
}

impl Drop for Putting {
    fn drop(&mut self) {
        if let Some(scope) = &self.release {
            self.store.release(&self.key, scope);
        }
    }
}

/// Where the fetch of `key` by the routes of `scope` is in [`Store::pending`] (the scope
/// is length-prefixed: no two pairs make the same bytes).
fn pending_key(key: &[u8], scope: &[u8]) -> Box<[u8]> {
    [scope, key].concat().into_boxed_slice()
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
            max_size: AtomicU64::new(config.max_size),
            max_object_size: AtomicU64::new(config.max_object_size),
            sendfile_min_size: AtomicU64::new(config.sendfile_min_size),
            max_fill_memory: AtomicU64::new(config.max_fill_memory),
            index_size: AtomicU64::new(config.index_size),
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
                store.loading.store(false, Release);
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
        let evictions_before = self.counts.evictions.load(Relaxed);
        let scanned = disk.scan(|found| {
            let key = found.key.clone();
            self.insert(&key, Entry::found(found, now), true);
        });
        let errors = scanned.discarded + scanned.unreadable;
        self.counts.errors.fetch_add(errors, Relaxed);
        self.loading.store(false, Release);
        tracing::info!(store = %self.config.name, entries = scanned.found,
            discarded = scanned.discarded, unreadable = scanned.unreadable,
            abandoned_writes = scanned.abandoned,
            ms = started.elapsed().as_millis() as u64, "cache store loaded");
        // A directory filled under larger bounds (or before `index_size` existed) loses
        // entries, and their files, in scan order: say so, with what to raise.
        let evicted = self.counts.evictions.load(Relaxed) - evictions_before;
        if evicted > 0 {
            tracing::warn!(store = %self.config.name, evicted,
                max_size = self.max_size(), index_size = self.index_size.load(Relaxed),
                "the cache directory held more than max_size or index_size allow: entries \
                 and their files were removed at load; raise index_size (or max_size) to keep them");
        }
    }

    /// Whether this store may serve as `config` (a reload's): the same name and kind (a
    /// disk store: the same directory), whatever its sizes ([`Store::resize`]).
    pub fn serves(&self, config: &CacheStore) -> bool {
        self.config.name == config.name && self.config.kind == config.kind
    }

    /// Applies `config`'s sizes (a reload's), evicting what a smaller `max_size` leaves out.
    pub fn resize(&self, config: &CacheStore) {
        self.max_object_size.store(config.max_object_size, Relaxed);
        self.sendfile_min_size
            .store(config.sendfile_min_size, Relaxed);
        self.max_size.store(config.max_size, Relaxed);
        self.max_fill_memory.store(config.max_fill_memory, Relaxed);
        self.index_size.store(config.index_size, Relaxed);
        let mut lru = self.lock();
        let (evicted, gone) = lru.evict_past(config.max_size, config.index_size);
        self.publish(&lru);
        drop(lru);
        self.counts.evictions.fetch_add(evicted, Relaxed);
        self.remove_files(&gone);
    }

    /// The entries' bytes together past which the least recently used go.
    pub fn max_size(&self) -> u64 {
        self.max_size.load(Relaxed)
    }

    /// The largest body stored.
    pub fn max_object_size(&self) -> u64 {
        self.max_object_size.load(Relaxed)
    }

    /// Whether a disk store's scan of its files is still running (what it found so far is
    /// indexed already).
    pub fn loading(&self) -> bool {
        self.loading.load(Acquire)
    }

    /// Whether this miss of `key` (by a route of `scope`) fetches it, or waits for the one
    /// of the same scope that does.
    pub fn turn(&self, key: &[u8], scope: &[u8]) -> Turn {
        let at = pending_key(key, scope);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leader) = pending.get(&at) {
            return Turn::Wait(leader.subscribe());
        }
        pending.insert(at, watch::Sender::new(()));
        Turn::Lead
    }

    /// The leader of `key` for the routes of `scope` is done (stored, or not): its
    /// followers look again.
    pub fn release(&self, key: &[u8], scope: &[u8]) {
        let at = pending_key(key, scope);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // Dropping the sender wakes the followers.
        pending.remove(&at);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding it leaves a consistent map (each step completes).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The variants stored under `key` by the routes of `scope` (the key marked as used),
    /// newest first.
    pub fn get(&self, key: &[u8], scope: &[u8]) -> Vec<Arc<Entry>> {
        let mut variants = self.lock().get(key);
        variants.retain(|e| e.variant.starts_with(scope));
        variants
    }

    /// Stores `entry` (its body in memory) under `key`: a memory store at once, or once
    /// its body is copied into a sealed memfd; a disk store once its file is written. The
    /// copy and the file are made on the blocking pool, so that a large miss does not
    /// stall the worker's other connections. `release`: the scope whose fetch of `key` is
    /// over once it is stored ([`Store::release`]), so that waiting requests find it.
    pub fn put(self: &Arc<Self>, key: Vec<u8>, entry: Entry, release: Option<Arc<[u8]>>) {
        self.put_holding(key, entry, release, None);
    }

    /// [`Store::put`] of a fill's entry, its `memory` let go once the entry is stored.
    pub fn put_holding(
        self: &Arc<Self>,
        key: Vec<u8>,
        entry: Entry,
        release: Option<Arc<[u8]>>,
        memory: Option<FillMemory>,
    ) {
        // A copy with no release to follow it (a stale entry refreshed in place) is made
        // here: the fetch's end lets the waiting requests look as soon as this returns,
        // and they must find the new entry.
        if self.disk.is_none() && !(release.is_some() && self.to_seal(&entry)) {
            self.keep(&key, self.sealed(entry), release.as_deref());
            return;
        }
        let putting = Putting {
            store: self.clone(),
            key,
            release,
            _memory: memory,
        };
        putting.run(move |store, key| match store.disk.is_some() {
            true => store.write(key, entry),
            false => store.keep(key, store.sealed(entry), None),
        });
    }

    /// Stores `entry` of `key` again, its head refreshed by a `304`, with `held`, the
    /// stale body that `304` confirmed (as the reply to it holds it; `entry`'s own `body`
    /// is replaced): a body in memory as [`Store::put`] does; a disk entry's file copied,
    /// file to file, into the new entry's file on the blocking pool ([`Disk::write_copy`]),
    /// so that a refresh never reads a large body into memory. `release`: as for `put`.
    pub fn put_refreshed(
        self: &Arc<Self>,
        key: Vec<u8>,
        mut entry: Entry,
        held: Held,
        release: Option<Arc<[u8]>>,
    ) {
        let (file, at, len) = match held {
            Held::File(file, at, len) => (file, at, len),
            Held::Memory(bytes) => {
                entry.body = Body::Memory(bytes);
                self.put(key, entry, release);
                return;
            }
            Held::Sealed(bytes, memfd) => {
                entry.body = Body::Sealed(bytes, memfd);
                self.put(key, entry, release);
                return;
            }
        };
        let putting = Putting {
            store: self.clone(),
            key,
            release,
            _memory: None,
        };
        putting.run(move |store, key| store.write_copy(key, entry, &file, at, len));
    }

    /// A memory store's insert of `entry`, then the fetch's release.
    fn keep(&self, key: &[u8], entry: Entry, release: Option<&[u8]>) {
        self.insert(key, entry, false);
        self.counts.stores.fetch_add(1, Relaxed);
        if let Some(scope) = release {
            self.release(key, scope);
        }
    }

    /// Whether `entry`'s body goes into a sealed memfd: in memory, at least
    /// `sendfile_min_size` long, and the kernel and the bound allow one.
    fn to_seal(&self, entry: &Entry) -> bool {
        let Body::Memory(bytes) = &entry.body else {
            return false;
        };
        let long = !bytes.is_empty() && bytes.len() as u64 >= self.sendfile_min_size.load(Relaxed);
        long && sealed::may_seal()
    }

    /// `entry` (of a memory store) with its body in a sealed memfd if it is to be
    /// ([`Store::to_seal`]; accounted by its pages); as it is if it is not, or if the
    /// memfd cannot be had (logged).
    fn sealed(&self, mut entry: Entry) -> Entry {
        if !self.to_seal(&entry) {
            return entry;
        }
        let Body::Memory(bytes) = &entry.body else {
            return entry;
        };
        let len = bytes.len() as u64;
        match sealed::seal(bytes) {
            Ok((memfd, mapped)) => {
                let page = crate::sys::page_size().unwrap_or(4096);
                entry.size += len.next_multiple_of(page) - len;
                entry.body = Body::Sealed(mapped, memfd);
            }
            Err(e) => tracing::debug!(store = %self.config.name, error = %e,
                "cache entry kept on the heap: no sealed memfd"),
        }
        entry
    }

    /// Writes `entry` to its file and indexes it there.
    fn write(&self, key: &[u8], entry: Entry) {
        let (Some(disk), Body::Memory(body)) = (&self.disk, &entry.body) else {
            return;
        };
        let written = disk.write(key, entry.meta(), body);
        self.place(disk, key, entry, written);
    }

    /// [`Store::write`] of `entry` with the body `len` bytes from `at` in the open file
    /// `from` (a refreshed disk entry's: [`Store::put_refreshed`]).
    fn write_copy(&self, key: &[u8], entry: Entry, from: &File, at: u64, len: u64) {
        let Some(disk) = &self.disk else { return };
        let written = disk.write_copy(key, entry.meta(), from, at, len);
        self.place(disk, key, entry, written);
    }

    /// Renames the file `written` for `entry` into place and indexes it there (removing
    /// the files of the entries it lets go); a write that failed is logged and counted.
    fn place(&self, disk: &Disk, key: &[u8], mut entry: Entry, written: io::Result<Written>) {
        let placed = written.and_then(|written| {
            disk.place(written, |at| {
                entry.size = at.file_len;
                entry.index = disk_index_cost(key, &at, &entry.headers);
                entry.body = Body::Disk(at);
                // Its sum is of the bytes just written (or copied from a checked file).
                entry.checked = Checked::new(true);
                self.index(key, entry, false)
            })
        });
        match placed {
            Ok(gone) => {
                self.remove_files(&gone);
                self.counts.stores.fetch_add(1, Relaxed);
            }
            Err(e) => {
                self.counts.errors.fetch_add(1, Relaxed);
                tracing::warn!(store = %self.config.name, error = %e, "cache entry not written");
            }
        }
    }

    /// Indexes `entry` under `key` (`only_new`: unless that variant is there) and evicts
    /// the least recently used keys past `max_size`, removing the files of the entries
    /// let go.
    fn insert(&self, key: &[u8], entry: Entry, only_new: bool) {
        let gone = self.index(key, entry, only_new);
        self.remove_files(&gone);
    }

    /// [`Store::insert`] but for the files: returns the entries let go.
    fn index(&self, key: &[u8], entry: Entry, only_new: bool) -> Vec<Arc<Entry>> {
        let mut lru = self.lock();
        let mut gone = lru.insert(key, Arc::new(entry), only_new);
        let (evicted, more) = lru.evict_past(self.max_size(), self.index_size.load(Relaxed));
        gone.extend(more);
        self.publish(&lru);
        drop(lru);
        self.counts.evictions.fetch_add(evicted, Relaxed);
        gone
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

    /// Removes the one variant `entry` of `key` (a refresh found it may no longer be
    /// stored), and its file; the key's other variants, other routes' included, stay.
    pub fn drop_entry(&self, key: &[u8], entry: &Arc<Entry>) {
        let mut lru = self.lock();
        let removed = lru.remove_entry(key, entry);
        self.publish(&lru);
        drop(lru);
        if removed {
            self.remove_files(std::slice::from_ref(entry));
        }
    }

    /// The body of `entry` (of `key`), if it can be had without waiting: in memory, a
    /// checked disk entry's file ([`Held::File`]: large enough for sendfile, or over
    /// [`SYNC_READ_MAX`], whatever `sendfile_min_size` says: read whole, such a body would
    /// be one copy in memory per request), or a small file read whole.
    pub fn body_now(&self, key: &[u8], entry: &Arc<Entry>) -> Ready {
        let (at, disk) = match (&entry.body, &self.disk) {
            (Body::Disk(at), Some(disk)) => (at, disk),
            (Body::Disk(_), None) => return Ready::Gone,
            (body, _) => return body.held().map_or(Ready::Gone, Ready::Now),
        };
        let small = at.file_len <= SYNC_READ_MAX;
        let file = entry.checked.is_ok()
            && (!small || at.body_len() >= self.sendfile_min_size.load(Relaxed));
        let got = match (file, small) {
            (true, _) => {
                (disk.open(at)).map(|f| Held::File(Arc::new(f), at.body_at(), at.body_len()))
            }
            (false, true) => disk.read(at, key).map(|body| {
                entry.checked.set_ok();
                Held::Memory(body)
            }),
            (false, false) => return Ready::Later,
        };
        match got {
            Ok(held) => Ready::Now(held),
            Err(why) => {
                self.unreadable(key, entry, why);
                Ready::Gone
            }
        }
    }

    /// The body of `entry` (of `key`): [`Store::body_now`]; or, when it is large and its
    /// sum not checked yet, its file once checked ([`Store::checked_file`]); `None` if its
    /// file could not be read (the entry is gone then). Whatever answers with it (a fresh
    /// hit, a stale entry a `304` confirmed or that answers for a failure), a disk body
    /// over [`SYNC_READ_MAX`] is never read into memory.
    pub async fn body(self: &Arc<Self>, key: &[u8], entry: &Arc<Entry>) -> Option<Held> {
        match (self.body_now(key, entry), &entry.body) {
            (Ready::Now(body), _) => Some(body),
            (Ready::Later, Body::Disk(at)) => self.checked_file(key, entry, *at).await,
            _ => None,
        }
    }

    /// The unchecked disk `entry` (of `key`, at `at`) as its file, once checked: by this
    /// request (a check on the blocking pool, [`Disk::check`]), or by the one whose check
    /// is under way, waited for. One check per entry at a time, whatever the hits; a
    /// check that failed is a miss for the hits that waited for it (the entry is dropped
    /// unless the file could not be read for now, [`Store::unreadable`]).
    async fn checked_file(
        self: &Arc<Self>,
        key: &[u8],
        entry: &Arc<Entry>,
        at: Location,
    ) -> Option<Held> {
        let checked = &entry.checked;
        // Registered before looking: a check that ends from here on wakes it.
        let done = std::pin::pin!(checked.done.notified());
        if !checked.is_ok() {
            if !checked.running.swap(true, AcqRel) {
                self.start_check(key, entry, at);
            }
            done.await;
        }
        // Its file, open again (a few syscalls): checked since, or replaced meanwhile.
        match self.body_now(key, entry) {
            Ready::Now(held) if checked.is_ok() => Some(held),
            _ => None,
        }
    }

    /// Checks `entry`'s file on the blocking pool (run to its end even if no request
    /// waits for it any more), then wakes the requests waiting for it.
    fn start_check(self: &Arc<Self>, key: &[u8], entry: &Arc<Entry>, at: Location) {
        let (store, run, key) = (self.clone(), CheckRun(entry.clone()), key.to_vec());
        let job = move || {
            let entry = &run.0;
            let checked = match &store.disk {
                Some(disk) => disk.check(&at, &key),
                None => Err(Unreadable::Stale),
            };
            match checked {
                Ok(()) => entry.checked.set_ok(),
                Err(why) => store.unreadable(&key, entry, why),
            }
            drop(run);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(job)),
            Err(_) => job(),
        }
    }

    /// `entry` of `key` could not be read (`why`): kept when the reading failed (counted),
    /// dropped when its file is another write's now, dropped and its file removed (counted)
    /// when the file is not whole.
    fn unreadable(&self, key: &[u8], entry: &Arc<Entry>, why: Unreadable) {
        let key_text = String::from_utf8_lossy(key);
        if let Unreadable::Io(e) = &why {
            self.counts.errors.fetch_add(1, Relaxed);
            tracing::warn!(store = %self.config.name, key = %key_text, error = %e,
                "cache entry not readable now: a miss");
            return;
        }
        let mut lru = self.lock();
        let removed = lru.remove_entry(key, entry);
        self.publish(&lru);
        drop(lru);
        if removed && matches!(why, Unreadable::Broken(_)) {
            self.counts.errors.fetch_add(1, Relaxed);
            tracing::warn!(store = %self.config.name, key = %key_text, error = %why,
                "cache entry unreadable: dropped");
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
        self.counts.index_bytes.store(lru.index, Relaxed);
        self.counts.entries.store(lru.len() as u64, Relaxed);
    }
}

/// What a disk entry's index entry takes in memory, estimated: its file's head part (key,
/// variant, stored head, serialised policy: the heads and request URI it holds), the two
/// copies of the key the index keeps besides ([`Lru`]), each field's map room for the
/// two maps that hold it (the entry's, the policy's), and the entry's own structure.
fn disk_index_cost(key: &[u8], at: &Location, headers: &http::HeaderMap) -> u64 {
    let fields = 2 * headers.len() as u64 * super::FIELD_ROOM as u64;
    at.body_at() + 2 * key.len() as u64 + fields + super::ENTRY_ROOM
}

impl Entry {
    /// What its file's head part holds besides its key.
    fn meta(&self) -> Meta<'_> {
        Meta {
            variant: &self.variant,
            policy: &self.policy,
            status: self.status,
            headers: &self.headers,
        }
    }

    /// The index entry of a file the scan found (`now`: when it was found).
    fn found(found: Found, now: SystemTime) -> Entry {
        let index = disk_index_cost(&found.key, &found.location, &found.headers);
        Entry {
            staleness: super::Staleness::of(&found.policy, &found.headers, now),
            policy: found.policy,
            status: found.status,
            headers: found.headers,
            size: found.location.file_len,
            index,
            body: Body::Disk(found.location),
            variant: found.variant,
            // Found whole by its head; its body's sum is checked when it is first read.
            checked: Checked::new(false),
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
            index: 0,
            checked: Checked::new(true),
        }
    }

    fn config(max: u64, kind: CacheKind) -> CacheStore {
        CacheStore {
            name: "t".into(),
            max_size: max,
            max_object_size: max,
            sendfile_min_size: 64 << 10,
            max_fill_memory: max,
            index_size: match &kind {
                CacheKind::Memory => u64::MAX,
                CacheKind::Disk { .. } => 1 << 30,
            },
            kind,
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
        assert_eq!(s.get(b"a", b"").len(), 1); // a is now the newest
        s.insert(b"d", entry(1000, b""), false);
        assert!(s.get(b"b", b"").is_empty(), "b was the least recently used");
        assert_eq!(s.get(b"a", b"").len(), 1);
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
        let got = s.get(b"http://h/a", b"");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].size, 30);
        s.insert(b"http://h/ab", entry(1, b""), false);
        s.insert(b"http://h/b", entry(1, b""), false);
        assert_eq!(s.purge(b"http://h/a", false), 1);
        assert_eq!(s.purge(b"http://h/a", true), 1);
        assert_eq!(s.counts.entries.load(Relaxed), 1);
        assert_eq!(s.counts.bytes.load(Relaxed), 1 + ENTRY_OVERHEAD);
    }

    /// A route's scope as `RouteCache::scope` makes it.
    fn scope(listener: &str, route: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for name in [listener, route] {
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        out
    }

    /// One route's many variants of a key push out its own oldest, never another route's.
    #[test]
    fn the_variant_cap_is_per_route() {
        let s = store(1 << 20);
        let (beta, prod) = (scope("web", "beta"), scope("web", "prod"));
        s.insert(
            b"http://h/a",
            entry(1, &[&prod[..], b"lang=en"].concat()),
            false,
        );
        for i in 0..20 {
            let variant = [&beta[..], format!("lang={i}").as_bytes()].concat();
            s.insert(b"http://h/a", entry(1, &variant), false);
        }
        assert_eq!(s.get(b"http://h/a", &prod).len(), 1, "prod's variant stays");
        let kept = s.get(b"http://h/a", &beta);
        assert_eq!(kept.len(), 8);
        assert!(kept[0].variant.ends_with(b"lang=19"), "newest first");
    }

    /// Polls (the scan runs in its own thread) until the store has loaded.
    fn loaded(s: &Store) {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while s.loading() {
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

    /// A disk store in a new directory (`tag`), loaded.
    fn disk_store(tag: &str, max: u64) -> (std::path::PathBuf, Arc<Store>) {
        let dir = std::env::temp_dir().join(format!("weir-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = Store::open(config(max, CacheKind::Disk { path: dir.clone() }));
        loaded(&s);
        (dir, s)
    }

    /// Writes `body` for `key` with `e`'s head straight to the files of `dir` (as another
    /// process sharing it would), not indexed.
    fn write_behind(dir: &std::path::Path, key: &[u8], e: &Entry, body: &[u8]) {
        let disk = Disk::new(dir.to_path_buf());
        let meta = Meta {
            variant: &e.variant,
            policy: &e.policy,
            status: e.status,
            headers: &e.headers,
        };
        let written = disk.write(key, meta, body).unwrap();
        disk.place(written, |_| ()).unwrap();
    }

    #[test]
    fn a_file_another_write_replaced_is_never_served_for_the_old_head_nor_removed() {
        let (dir, s) = disk_store("replaced", 1 << 20);
        // No runtime here: each file is written before `put` returns.
        s.put(b"http://h/a".to_vec(), entry(4, b""), None);
        let old = s.get(b"http://h/a", b"").remove(0);
        // The same length, so that only the write id tells them apart.
        write_behind(&dir, b"http://h/a", &entry(4, b""), b"newr");
        assert!(
            matches!(s.body_now(b"http://h/a", &old), Ready::Gone),
            "the old head never goes out with the new body"
        );
        assert!(
            s.get(b"http://h/a", b"").is_empty(),
            "the stale entry is dropped"
        );
        assert_eq!(files(&dir).0, 1, "the newer file is left");
        assert_eq!(s.counts.errors.load(Relaxed), 0, "not an error");

        // Purged (or evicted) after its file was replaced: the newer file stays.
        s.put(b"http://h/b".to_vec(), entry(4, b""), None);
        write_behind(&dir, b"http://h/b", &entry(4, b""), b"newr");
        assert_eq!(s.purge(b"http://h/b", false), 1);
        assert_eq!(files(&dir).0, 2, "the newer file of /b is not removed");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_memory_store_seals_bodies_of_sendfile_min_size_and_keeps_smaller_ones() {
        let s = store(1 << 20);
        s.put(b"http://h/big".to_vec(), entry(64 << 10, b""), None);
        s.put(b"http://h/small".to_vec(), entry((64 << 10) - 1, b""), None);
        let big = s.get(b"http://h/big", b"").remove(0);
        let Ready::Now(Held::Sealed(bytes, memfd)) = s.body_now(b"http://h/big", &big) else {
            panic!("a body of sendfile_min_size is in a sealed memfd");
        };
        assert_eq!(bytes, vec![b'x'; 64 << 10]);
        assert_eq!(memfd.file.metadata().unwrap().len(), 64 << 10);
        let small = s.get(b"http://h/small", b"").remove(0);
        let ready = s.body_now(b"http://h/small", &small);
        assert!(matches!(ready, Ready::Now(Held::Memory(_))));
        // Purged while a hit holds it: the hit's bytes and file stay whole.
        assert_eq!(s.purge(b"http://h/big", false), 1);
        drop(big);
        assert_eq!(bytes.len(), 64 << 10);
        assert_eq!(memfd.file.metadata().unwrap().len(), 64 << 10);
    }

    #[test]
    fn a_disk_entry_is_sent_from_its_file_once_its_sum_was_checked() {
        let (dir, s) = disk_store("sendfile", 1 << 20);
        s.put(b"http://h/a".to_vec(), entry(100 << 10, b""), None);
        let written = s.get(b"http://h/a", b"").remove(0);
        // Written by this process: its file as it is.
        let Ready::Now(Held::File(_, at, len)) = s.body_now(b"http://h/a", &written) else {
            panic!("a checked entry's file");
        };
        assert_eq!((len, at + len), (100 << 10, written.size));

        // Found by the scan: its sum checked once (not read into memory), then its file.
        let again = Store::open(config(1 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        let found = again.get(b"http://h/a", b"").remove(0);
        assert!(matches!(
            again.body_now(b"http://h/a", &found),
            Ready::Later
        ));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let read = runtime.block_on(again.body(b"http://h/a", &found));
        assert!(matches!(read, Some(Held::File(_, _, len)) if len == 100 << 10));
        let ready = again.body_now(b"http://h/a", &found);
        assert!(matches!(ready, Ready::Now(Held::File(..))));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `n` hits at once of `key`'s first entry in `s`, each as a fresh hit's read.
    fn hits_at_once(s: &Arc<Store>, key: &'static [u8], n: usize) -> Vec<Option<Held>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let entry = s.get(key, b"").remove(0);
        runtime.block_on(async {
            let hits = (0..n).map(|_| {
                let (s, entry) = (s.clone(), entry.clone());
                tokio::spawn(async move { s.body(key, &entry).await })
            });
            let hits: Vec<_> = hits.collect();
            let mut out = Vec::new();
            for hit in hits {
                out.push(hit.await.unwrap());
            }
            out
        })
    }

    /// The path of the one file in the store directory `dir`.
    fn only_file(dir: &std::path::Path) -> std::path::PathBuf {
        let sub = std::fs::read_dir(dir).unwrap().flatten().next().unwrap();
        let file = std::fs::read_dir(sub.path()).unwrap().flatten().next();
        file.unwrap().path()
    }

    /// Attacker review: after a restart, each concurrent hit of a large entry read its
    /// whole body into memory until one of them had checked it (20 slow clients of a
    /// 30 MB entry: +600 MB). Now one check, the others wait for it: every hit sends the
    /// file, none holds a copy; once checked, the file is not read again.
    #[test]
    fn concurrent_first_hits_of_a_scanned_entry_check_it_once_and_copy_nothing() {
        let (dir, s) = disk_store("once", 4 << 20);
        s.put(b"http://h/a".to_vec(), entry(1 << 20, b""), None);
        drop(s);
        let again = Store::open(config(4 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        for hit in hits_at_once(&again, b"http://h/a", 20) {
            assert!(
                matches!(hit, Some(Held::File(_, _, len)) if len == 1 << 20),
                "every hit sends the checked file, none a copy"
            );
        }
        // Checked once: damaged in place since (the same length and write), it is not
        // read again (a file this process checked or wrote is sent as it is).
        let path = only_file(&dir);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let hit = hits_at_once(&again, b"http://h/a", 1).remove(0);
        assert!(matches!(hit, Some(Held::File(..))));
        assert_eq!(again.counts.errors.load(Relaxed), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The hits that wait for a check that fails are misses: nothing of the damaged file
    /// is sent, and it is removed.
    #[test]
    fn concurrent_first_hits_of_a_damaged_entry_are_all_misses() {
        let (dir, s) = disk_store("damaged-at-once", 4 << 20);
        s.put(b"http://h/a".to_vec(), entry(1 << 20, b""), None);
        drop(s);
        let path = only_file(&dir);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let again = Store::open(config(4 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        for hit in hits_at_once(&again, b"http://h/a", 20) {
            assert!(hit.is_none(), "a damaged body is never sent");
        }
        assert!(again.get(b"http://h/a", b"").is_empty(), "dropped");
        assert!(!path.exists(), "its file removed");
        assert_eq!(again.counts.errors.load(Relaxed), 1, "checked once");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_scanned_entry_whose_body_was_damaged_is_never_sent() {
        let (dir, s) = disk_store("damaged", 1 << 20);
        s.put(b"http://h/a".to_vec(), entry(100 << 10, b""), None);
        let sub = std::fs::read_dir(&dir).unwrap().flatten().next().unwrap();
        let path = std::fs::read_dir(sub.path())
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let again = Store::open(config(1 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        let found = again.get(b"http://h/a", b"").remove(0);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(runtime
            .block_on(again.body(b"http://h/a", &found))
            .is_none());
        assert!(again.get(b"http://h/a", b"").is_empty(), "dropped");
        assert!(!path.exists(), "its file removed");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A small body under a large head: its file is past what is read where a hit is
    /// looked up, so it is never read there: sent from its file (checked: this process
    /// wrote it), or checked on the blocking pool first (found by the scan).
    #[test]
    fn a_small_body_under_a_large_head_is_not_read_on_the_event_loop() {
        let (dir, s) = disk_store("bighead", 1 << 20);
        let mut e = entry(10, b"");
        let big = "v".repeat(SYNC_READ_MAX as usize);
        e.headers.insert("x-big", big.parse().unwrap());
        s.put(b"http://h/a".to_vec(), e, None);
        let got = s.get(b"http://h/a", b"");
        assert!(matches!(
            s.body_now(b"http://h/a", &got[0]),
            Ready::Now(Held::File(_, _, 10))
        ));
        let again = Store::open(config(1 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        let found = again.get(b"http://h/a", b"").remove(0);
        assert!(matches!(
            again.body_now(b"http://h/a", &found),
            Ready::Later
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Review of content2: a body under `sendfile_min_size` whose file is over
    /// [`SYNC_READ_MAX`] was read whole into memory by each hit (a `sendfile_min_size`
    /// over `max_object_size` made every large hit a copy). Now it is sent from its file.
    #[test]
    fn a_large_body_under_sendfile_min_size_is_sent_from_its_file() {
        let dir = std::env::temp_dir().join(format!("weir-store-under-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut conf = config(4 << 20, CacheKind::Disk { path: dir.clone() });
        conf.sendfile_min_size = 1 << 30;
        let s = Store::open(conf);
        loaded(&s);
        s.put(b"http://h/a".to_vec(), entry(1 << 20, b""), None);
        s.put(b"http://h/b".to_vec(), entry(1000, b""), None);
        let large = s.get(b"http://h/a", b"").remove(0);
        let ready = s.body_now(b"http://h/a", &large);
        assert!(matches!(ready, Ready::Now(Held::File(_, _, len)) if len == 1 << 20));
        // A small file is still read at once (it goes out with its head in one write).
        let small = s.get(b"http://h/b", b"").remove(0);
        let ready = s.body_now(b"http://h/b", &small);
        assert!(matches!(ready, Ready::Now(Held::Memory(b)) if b.len() == 1000));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A stale disk entry refreshed by a `304` is stored again with its body copied from
    /// the file its reply holds, file to file: the new file has the new head and the
    /// body, whole and with its sum (a later process's check passes), and replaces the
    /// old one.
    #[test]
    fn a_refreshed_disk_entry_gets_its_body_copied_from_its_file() {
        let (dir, s) = disk_store("refresh-copy", 4 << 20);
        let body: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        let mut stale = entry(0, b"");
        stale.body = Body::Memory(Bytes::from(body.clone()));
        s.put(b"http://h/a".to_vec(), stale, None);
        let old = s.get(b"http://h/a", b"").remove(0);
        let Ready::Now(held @ Held::File(..)) = s.body_now(b"http://h/a", &old) else {
            panic!("a checked entry's file");
        };
        let mut refreshed = entry(0, b"");
        refreshed
            .headers
            .insert("x-refreshed", "1".parse().unwrap());
        // No runtime here: the file is written before `put_refreshed` returns.
        s.put_refreshed(b"http://h/a".to_vec(), refreshed, held, None);
        assert_eq!(s.counts.errors.load(Relaxed), 0);
        let new = s.get(b"http://h/a", b"").remove(0);
        assert_eq!(new.headers["x-refreshed"], "1");
        assert_eq!(files(&dir).0, 1, "the new file took the old one's place");

        let again = Store::open(config(4 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        let found = again.get(b"http://h/a", b"").remove(0);
        assert_eq!(found.headers["x-refreshed"], "1");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let Some(Held::File(file, at, len)) = runtime.block_on(again.body(b"http://h/a", &found))
        else {
            panic!("the copy passes the check");
        };
        let mut copied = vec![0; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut copied, at).unwrap();
        assert!(copied == body, "the body, whole");
        assert_eq!(again.counts.errors.load(Relaxed), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_that_cannot_be_read_for_now_is_a_miss_and_kept() {
        let (dir, s) = disk_store("ioerror", 1 << 20);
        s.put(b"http://h/a".to_vec(), entry(10, b""), None);
        let got = s.get(b"http://h/a", b"");
        let subdir = std::fs::read_dir(&dir).unwrap().flatten().next().unwrap();
        let path = std::fs::read_dir(subdir.path())
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .path();
        // Reading a directory fails with EISDIR: an I/O error, not a bad file.
        let aside = path.with_extension("aside");
        std::fs::rename(&path, &aside).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(s.body_now(b"http://h/a", &got[0]), Ready::Gone));
        assert_eq!(s.counts.errors.load(Relaxed), 1);
        assert_eq!(s.get(b"http://h/a", b"").len(), 1, "the entry is kept");
        let again = Store::open(config(1 << 20, CacheKind::Disk { path: dir.clone() }));
        loaded(&again);
        assert!(path.is_dir(), "the scan leaves it");
        assert_eq!(again.counts.errors.load(Relaxed), 1);
        std::fs::remove_dir(&path).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        assert!(matches!(s.body_now(b"http://h/a", &got[0]), Ready::Now(_)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_disk_store_keeps_its_files_within_max_size_and_finds_them_again() {
        let (dir, s) = disk_store("evict", 20_000);
        let kind = CacheKind::Disk { path: dir.clone() };
        for i in 0..10 {
            // No runtime here: each file is written before `put` returns.
            s.put(format!("http://h/{i}").into_bytes(), entry(4000, b""), None);
        }
        let (count, bytes) = files(&dir);
        assert!(bytes <= 20_000, "{bytes} bytes in {count} files");
        assert_eq!(count as u64, s.counts.entries.load(Relaxed));
        assert!(s.counts.evictions.load(Relaxed) >= 6);
        let newest = s.get(b"http://h/9", b"");
        let Ready::Now(Held::Memory(body)) = s.body_now(b"http://h/9", &newest[0]) else {
            panic!("a small body is read at once");
        };
        assert_eq!(body.len(), 4000);
        assert_eq!(s.purge(b"http://h/9", false), 1);
        assert_eq!(files(&dir).0, count - 1);

        let again = Store::open(config(20_000, kind));
        loaded(&again);
        assert_eq!(again.counts.entries.load(Relaxed), count as u64 - 1);
        assert_eq!(again.get(b"http://h/8", b"").len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
