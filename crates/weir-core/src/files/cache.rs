//! The worker's open-file cache: for hot paths, the open descriptor and what was learnt
//! of the file (validators, type), so a request for it costs no open(2) and no fstat(2).
//! A path found missing is kept too (a precompressed sibling that does not exist is asked
//! for on every request). Each entry is served for the route's `open_file_cache_valid`,
//! then looked up again; at the route's `open_file_cache` entries, expired ones are
//! dropped (at most once per `open_file_cache_valid`) and then one missing path's, or
//! (for an open file) any one: a missing path never pushes an open file out, so a crawl
//! of invented names keeps no real file out of the cache. One per worker, so
//! no lock. The descriptors all workers' caches hold together stay within a quarter of the
//! process's open-file limit ([`crate::sys::descriptor_share`], as the cache's sealed
//! memfds): past it a worker makes room in its own cache as when it is full, or keeps no
//! file, so that connections keep their descriptors. Only what a path was found to be is
//! kept, never a failure to look (out of descriptors or memory: `lookup`).

use std::collections::HashMap;
use std::fs::File;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::http::Validators;

/// An open regular file and what its responses say about it.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub file: File,
    pub validators: Validators,
    /// From the name's extension.
    pub content_type: Box<str>,
    /// A directory (its index is looked for, or it is listed).
    pub dir: bool,
}

/// What a path was found to be.
pub(crate) type Found = Option<Rc<OpenFile>>;

/// The open files all workers' caches hold.
static HELD: AtomicU64 = AtomicU64::new(0);

/// The most open files the caches hold when the open-file limit cannot be read.
const HELD_UNKNOWN: u64 = 256;

/// How many open files all workers' caches may hold together.
fn held_bound() -> u64 {
    crate::sys::descriptor_share().unwrap_or(HELD_UNKNOWN)
}

/// A cache entry: what the path was found to be, and when; an open file counted in
/// [`HELD`] while the entry lives.
struct Kept {
    found: Found,
    at: Instant,
}

impl Kept {
    fn new(found: Found, at: Instant) -> Kept {
        if found.is_some() {
            HELD.fetch_add(1, Relaxed);
        }
        Kept { found, at }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if self.found.is_some() {
            HELD.fetch_sub(1, Relaxed);
        }
    }
}

#[derive(Default)]
pub(crate) struct OpenFiles {
    entries: HashMap<Box<[u8]>, Kept>,
    /// The key being looked up: the route's id, then the path (no allocation per hit).
    key: Vec<u8>,
    /// When expired entries were last dropped: at most once per `valid`, so a flood of
    /// new paths (each a miss kept) does not scan the whole cache per request.
    swept: Option<Instant>,
    /// How many entries are of missing paths.
    missing: usize,
}

impl OpenFiles {
    /// The entry for `path` of file server `id`, if it is younger than `valid` at `now`.
    pub fn get(&mut self, id: u64, path: &[u8], now: Instant, valid: Duration) -> Option<Found> {
        self.set_key(id, path);
        let kept = self.entries.get(self.key.as_slice())?;
        (now.saturating_duration_since(kept.at) < valid).then(|| kept.found.clone())
    }

    /// Keeps `found` for `path` (at most `max` entries in all, each `valid` for that long;
    /// an open file only within the processes' share of descriptors).
    pub fn put(
        &mut self,
        id: u64,
        path: &[u8],
        found: Found,
        now: Instant,
        max: usize,
        valid: Duration,
    ) {
        if max == 0 {
            return;
        }
        self.set_key(id, path);
        let opens = found.is_some();
        let full = |entries: &HashMap<_, _>| {
            entries.len() >= max || (opens && HELD.load(Relaxed) >= held_bound())
        };
        // Its old entry goes first (an open file counted, maybe).
        let key = std::mem::take(&mut self.key);
        self.remove(&key);
        self.key = key;
        if full(&self.entries) {
            self.sweep(now, valid);
        }
        if full(&self.entries) {
            self.drop_one(opens);
        }
        if full(&self.entries) {
            // Other workers' files hold the share, or (a missing path) open files fill
            // the cache: this one is not kept.
            return;
        }
        if !opens {
            self.missing += 1;
        }
        let key: Box<[u8]> = self.key.as_slice().into();
        self.entries.insert(key, Kept::new(found, now));
    }

    /// Drops the expired entries, at most once per `valid` (a flood of new paths does not
    /// scan the whole cache per request).
    fn sweep(&mut self, now: Instant, valid: Duration) {
        let due = self
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= valid);
        if due {
            self.swept = Some(now);
            self.entries
                .retain(|_, kept| now.saturating_duration_since(kept.at) < valid);
            self.missing = self.entries.values().filter(|k| k.found.is_none()).count();
        }
    }

    /// Makes room for an entry that holds an open file if `file` (and past the share of
    /// descriptors, drops one that holds a file), else for a missing path: drops a
    /// missing path's entry if there is one, else (only for an open file) any one. A miss
    /// never pushes an open file out: a crawl of invented paths (404s) cannot empty the
    /// cache of the files that are asked for.
    fn drop_one(&mut self, file: bool) {
        let past_share = file && HELD.load(Relaxed) >= held_bound();
        let wanted = |k: &Kept| match past_share {
            true => k.found.is_some(),
            false => k.found.is_none(),
        };
        let mut doomed = match past_share || self.missing > 0 {
            true => self.entries.iter().find(|(_, k)| wanted(k)),
            false => None,
        };
        if doomed.is_none() && file && !past_share {
            doomed = self.entries.iter().next();
        }
        if let Some(key) = doomed.map(|(key, _)| key.clone()) {
            self.remove(&key);
        }
    }

    /// Drops the entry of `key`, if any.
    fn remove(&mut self, key: &[u8]) {
        if let Some(kept) = self.entries.remove(key) {
            self.missing -= usize::from(kept.found.is_none());
        }
    }

    fn set_key(&mut self, id: u64, path: &[u8]) {
        self.key.clear();
        self.key.extend_from_slice(&id.to_le_bytes());
        self.key.extend_from_slice(path);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_entries_expire() {
        let mut c = OpenFiles::default();
        let now = Instant::now();
        let valid = Duration::from_secs(2);
        for i in 0..10u8 {
            c.put(1, &[i], None, now, 4, valid);
        }
        assert_eq!(c.len(), 4);
        assert!(c.get(1, &[9], now, valid).is_some_and(|f| f.is_none()));
        assert!(
            c.get(2, &[9], now, valid).is_none(),
            "another route's entry"
        );
        let later = now + valid;
        assert!(c.get(1, &[9], later, valid).is_none(), "expired");
    }

    fn open_file() -> Found {
        Some(Rc::new(OpenFile {
            file: File::open("/dev/null").unwrap(),
            validators: super::super::http::Validators { len: 0, mtime: 0 },
            content_type: "text/plain".into(),
            dir: false,
        }))
    }

    /// Attacker review: a crawl of invented paths filled the cache with misses, pushing
    /// the open files out. A miss takes only another miss's place; an open file takes a
    /// miss's first.
    #[test]
    fn missing_paths_never_push_open_files_out() {
        let mut c = OpenFiles::default();
        let now = Instant::now();
        let valid = Duration::from_secs(60);
        for i in 0..2u8 {
            c.put(1, &[b'f', i], open_file(), now, 4, valid);
        }
        for i in 0..200u8 {
            c.put(1, &[b'm', i], None, now, 4, valid);
        }
        assert_eq!(c.len(), 4);
        for i in 0..2u8 {
            let kept = c.get(1, &[b'f', i], now, valid);
            assert!(kept.is_some_and(|f| f.is_some()), "open file {i} kept");
        }
        assert!(
            c.get(1, &[b'm', 199], now, valid).is_some(),
            "the newest miss"
        );
        for i in 2..4u8 {
            c.put(1, &[b'f', i], open_file(), now, 4, valid);
        }
        assert_eq!(
            (c.len(), c.missing),
            (4, 0),
            "open files took the misses' places"
        );
        c.put(1, b"gone", None, now, 4, valid);
        assert!(
            c.get(1, b"gone", now, valid).is_none(),
            "a miss is not kept then"
        );
        // An open file still takes any place: the cache keeps the newest files.
        c.put(1, b"f9", open_file(), now, 4, valid);
        assert!(c.get(1, b"f9", now, valid).is_some());
        assert_eq!(c.len(), 4);
    }
}
