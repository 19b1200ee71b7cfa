//! The worker side of fleet-wide rate limits (`rate_limit = { ..., shared = "NAME" }`).
//!
//! A shared limiter decides every request locally, exactly like a local one (its GCRA
//! table), so the request path makes no round trip. What it admitted is noted in the
//! worker's own [`PendingCounts`] (a `RefCell`: no atomics, no lock), keyed by limiter and
//! key. Each worker's sync task wakes every `sync_interval` while there is something to
//! send, takes the counts out and hands them to the process's Redis sync (`redis_sync`),
//! which adds them to the fleet's counts in one script call per batch and merges each
//! key's fleet-wide TAT back into the limiter's table. Between two syncs an instance sees
//! the others' admissions as of the last sync: that delay is the overshoot bound
//! (docs/cluster.md).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use weir_config::{OnRedisError, RedisSettings};

use crate::connector::AddrHasher;
use crate::filters::rate_limit::RateLimiter;
use crate::worker::Worker;

/// A shared limiter's link to its fleet-wide count.
#[derive(Debug)]
pub struct SharedCount {
    /// Its `[cluster.redis.NAME]`.
    pub redis: RedisSettings,
    /// The limit's part of the Redis keys: `LISTENER/ROUTE` (the same on every instance).
    pub name: String,
    pub on_error: OnRedisError,
    /// Set while this limiter's last sync failed (Redis down or slow); read per request
    /// only with `on_error = "deny"`.
    down: AtomicBool,
}

impl SharedCount {
    pub fn new(redis: RedisSettings, name: String, on_error: OnRedisError) -> SharedCount {
        SharedCount {
            redis,
            name,
            on_error,
            down: AtomicBool::new(false),
        }
    }

    /// Whether requests are refused now: `on_error = "deny"` and the last sync failed.
    #[inline]
    pub fn denies(&self) -> bool {
        self.on_error == OnRedisError::Deny && self.down.load(Ordering::Relaxed)
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }
}

/// What one worker sends of one limiter at a sync: each key's admissions since the last.
pub struct Batch {
    pub limiter: Arc<RateLimiter>,
    pub counts: Vec<KeyCount>,
}

/// One key's admissions in a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyCount {
    /// The limiter's [`RateLimiter::hash`] of the key: where the fleet's count goes back.
    pub hash: u64,
    /// The key as noted (a client address as its octets), for its Redis key.
    pub key: Box<[u8]>,
    /// Admitted requests; 0 reads the fleet's count without adding (a refused request,
    /// so that a limiter refusing everything still learns when to stop).
    pub admitted: u32,
}

/// One worker's counts since its last sync, per shared limiter.
#[derive(Default)]
pub struct PendingCounts {
    limiters: RefCell<Vec<Pending>>,
    /// The sync task, parked while there is nothing to send.
    waiting: Cell<Option<Waker>>,
}

struct Pending {
    limiter: Arc<RateLimiter>,
    /// By the limiter's hash of the key (already made for its check: no second SipHash).
    counts: HashMap<u64, Count, BuildHasherDefault<AddrHasher>>,
}

struct Count {
    key: Box<[u8]>,
    admitted: u32,
    /// Seen since the last sync (an entry not seen for a whole interval is dropped).
    seen: bool,
}

impl PendingCounts {
    /// Notes a request of `limiter` (which is shared) for `key`, whose hash by the limiter
    /// is `hash`; `admitted`: it passed. Keys beyond the limiter's `max_keys` in one
    /// interval are not sent (they are still limited locally).
    pub fn note(&self, limiter: &Arc<RateLimiter>, hash: u64, key: &[u8], admitted: bool) {
        let mut limiters = self.limiters.borrow_mut();
        let i = match limiters
            .iter()
            .position(|p| Arc::ptr_eq(&p.limiter, limiter))
        {
            Some(i) => i,
            None => {
                limiters.push(Pending {
                    limiter: limiter.clone(),
                    counts: HashMap::default(),
                });
                if let Some(waker) = self.waiting.take() {
                    waker.wake();
                }
                limiters.len() - 1
            }
        };
        let counts = &mut limiters[i].counts;
        let admitted = u32::from(admitted);
        if let Some(count) = counts.get_mut(&hash) {
            count.admitted = count.admitted.saturating_add(admitted);
            count.seen = true;
        } else if counts.len() < limiter.config.max_keys {
            let count = Count {
                key: key.into(),
                admitted,
                seen: true,
            };
            counts.insert(hash, count);
        }
    }

    /// The counts of every key seen since the last call, one batch per limiter; keys not
    /// seen are forgotten (so a key's entry is allocated again only after a quiet
    /// interval), and so are limiters with no key left.
    fn take(&self) -> Vec<Batch> {
        let mut limiters = self.limiters.borrow_mut();
        let mut batches = Vec::with_capacity(limiters.len());
        for p in limiters.iter_mut() {
            let mut counts = Vec::new();
            p.counts.retain(|&hash, count| {
                let seen = std::mem::take(&mut count.seen);
                if seen {
                    let admitted = std::mem::take(&mut count.admitted);
                    let key = count.key.clone();
                    counts.push(KeyCount {
                        hash,
                        key,
                        admitted,
                    });
                }
                seen
            });
            if !counts.is_empty() {
                batches.push(Batch {
                    limiter: p.limiter.clone(),
                    counts,
                });
            }
        }
        limiters.retain(|p| !p.counts.is_empty());
        batches
    }

    /// The shortest `sync_interval` of the limiters with counts.
    fn interval(&self) -> Option<Duration> {
        let limiters = self.limiters.borrow();
        let intervals = limiters.iter().filter_map(|p| p.limiter.shared.as_ref());
        intervals.map(|s| s.redis.sync_interval).min()
    }

    /// Resolves once some count is pending.
    fn pending(&self) -> Wait<'_> {
        Wait { counts: self }
    }
}

/// The future of [`PendingCounts::pending`].
struct Wait<'a> {
    counts: &'a PendingCounts,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.counts.limiters.borrow().is_empty() {
            self.counts.waiting.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// A worker's sync task: while some count is pending, every `sync_interval` the counts go
/// to the process's Redis sync; parked (no timer) while none is.
pub async fn sync_task(worker: Rc<Worker>) {
    loop {
        worker.shared_counts.pending().await;
        let Some(interval) = worker.shared_counts.interval() else {
            continue;
        };
        tokio::time::sleep(interval).await;
        let batches = worker.shared_counts.take();
        if !batches.is_empty() {
            // The receiver is gone only while the process stops.
            let _ = worker.shared.cluster.send(batches);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_config::{RateKey, RateLimit};

    fn shared_limiter(max_keys: usize) -> Arc<RateLimiter> {
        let config = RateLimit {
            interval: Duration::from_millis(10),
            burst: 5,
            key: RateKey::Header("k".into()),
            max_keys,
            shared: None,
        };
        let redis = RedisSettings {
            name: "r".into(),
            url: "redis://127.0.0.1:1".into(),
            ca: None,
            client_cert: None,
            password_file: None,
            timeout: Duration::from_secs(1),
            sync_interval: Duration::from_millis(50),
            prefix: "weir:".into(),
        };
        let shared = SharedCount::new(redis, "l/r".into(), OnRedisError::Allow);
        Arc::new(RateLimiter::new(&config).sharing(shared))
    }

    #[test]
    fn counts_are_taken_per_key_and_quiet_keys_are_forgotten() {
        let (a, b) = (shared_limiter(16), shared_limiter(16));
        let counts = PendingCounts::default();
        assert_eq!(counts.interval(), None);
        let note =
            |l: &Arc<RateLimiter>, key: &[u8], admitted| counts.note(l, l.hash(key), key, admitted);
        note(&a, b"x", true);
        note(&a, b"x", true);
        note(&a, b"y", false);
        note(&b, b"x", true);
        assert_eq!(counts.interval(), Some(Duration::from_millis(50)));
        let batches = counts.take();
        assert_eq!(batches.len(), 2);
        let mut first: Vec<_> = batches[0]
            .counts
            .iter()
            .map(|c| (c.hash, &c.key[..], c.admitted))
            .collect();
        first.sort();
        let mut want = vec![(a.hash(b"x"), &b"x"[..], 2), (a.hash(b"y"), &b"y"[..], 0)];
        want.sort();
        assert_eq!(first, want);
        assert!(Arc::ptr_eq(&batches[1].limiter, &b));
        // Seen again: counted from zero; not seen: gone, and a limiter with no key too.
        note(&a, b"x", true);
        let batches = counts.take();
        assert_eq!(batches.len(), 1);
        let x = KeyCount {
            hash: a.hash(b"x"),
            key: b"x"[..].into(),
            admitted: 1,
        };
        assert_eq!(batches[0].counts, vec![x]);
        assert!(counts.take().is_empty());
        assert!(counts.limiters.borrow().is_empty());
    }

    #[test]
    fn keys_past_max_keys_are_not_noted() {
        let a = shared_limiter(16);
        let counts = PendingCounts::default();
        for k in 0..20u8 {
            counts.note(&a, a.hash([k]), &[k], true);
        }
        assert_eq!(counts.take()[0].counts.len(), 16);
    }
}
