//! Rate limits (`rate_limit = { rate, burst, key, max_keys }` of a route): GCRA over a
//! fixed table of atomics shared by every worker, so a limit is exact across workers with
//! no lock and a few atomic operations per request.
//!
//! GCRA keeps one "theoretical arrival time" (TAT) per key. With emission interval `T`
//! (`1s / rate`) and tolerance `tau = T * (burst - 1)`, a request at `now` passes when
//! `max(TAT, now) - now <= tau` and moves the TAT to `max(TAT, now) + T`; `burst` requests
//! pass at once, then one per `T`. A refused request waits `TAT - now - tau` (Retry-After).
//!
//! The table has `max_keys` slots in buckets of 4 (set-associative, like a CPU cache). A
//! slot is one `AtomicU64`: a 16-bit tag of the key's hash and a 48-bit TAT in microseconds
//! since the limiter was made (8.9 years), updated by compare-and-swap. A key not in its
//! bucket takes the slot with the lowest TAT: a slot whose TAT has passed holds no state
//! (its key would start afresh anyway), so eviction loses nothing until all 4 keys of a
//! bucket are being limited at once; then the one closest to its full burst is forgotten.
//! Memory is fixed at 8 bytes a slot: address churn cannot grow it. Two keys with the same
//! bucket and tag (about 1 in 65536 per pair sharing a bucket) share a limit. Keys are
//! hashed with a per-limiter random SipHash key, so clients cannot aim at one bucket.
//!
//! A limit with `shared = "NAME"` keeps this table as its local view and counts across the
//! fleet through Redis (`cluster::shared_limit`): each worker notes what it admitted, a sync
//! sends the counts and [`RateLimiter::merge`]s back the fleet's TAT of each key.

use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use weir_config::RateLimit;

use crate::cluster::shared_limit::SharedCount;

/// Slots per bucket.
const WAYS: usize = 4;
const TAT_BITS: u32 = 48;
const TAT_MASK: u64 = (1 << TAT_BITS) - 1;

pub struct RateLimiter {
    /// The config it was made for: a reload keeps the limiter while this is unchanged.
    pub config: RateLimit,
    interval_us: u64,
    tolerance_us: u64,
    epoch: Instant,
    hasher: RandomState,
    slots: Box<[AtomicU64]>,
    /// `shared`: the fleet-wide count this limiter takes part in.
    pub shared: Option<SharedCount>,
}

impl RateLimiter {
    /// A limiter of `config` (its `shared` settings left to [`RateLimiter::sharing`]).
    pub fn new(config: &RateLimit) -> RateLimiter {
        let interval_us = (config.interval.as_micros() as u64).clamp(1, TAT_MASK / 4);
        let buckets = (config.max_keys / WAYS).next_power_of_two().max(1);
        RateLimiter {
            config: config.clone(),
            interval_us,
            tolerance_us: interval_us
                .saturating_mul(u64::from(config.burst.max(1)) - 1)
                .min(TAT_MASK / 4),
            epoch: Instant::now(),
            hasher: RandomState::new(),
            slots: (0..buckets * WAYS).map(|_| AtomicU64::new(0)).collect(),
            shared: None,
        }
    }

    /// This limiter, counting across the fleet through `shared`.
    pub fn sharing(mut self, shared: SharedCount) -> RateLimiter {
        self.shared = Some(shared);
        self
    }

    /// Time between two requests at the sustained rate, in microseconds.
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// The hash of `key` (per limiter, keyed at random) that [`RateLimiter::check_hash`]
    /// takes: computed once per request, also for a shared limit's pending counts.
    #[inline]
    pub fn hash(&self, key: impl Hash) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The tag and the bucket's slots of the key `hash`. Tag 0 marks an empty slot.
    fn locate(&self, hash: u64) -> (u64, &[AtomicU64]) {
        let bucket = (hash as usize) & (self.slots.len() / WAYS - 1);
        (
            (hash >> TAT_BITS).max(1),
            &self.slots[bucket * WAYS..][..WAYS],
        )
    }

    fn now_us(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch).as_micros() as u64)
            .min(TAT_MASK - self.tolerance_us - self.interval_us)
    }

    /// Counts a request for `key` arriving at `now`. `Err`: refused, retry after that long.
    pub fn check(&self, key: impl Hash, now: Instant) -> Result<(), Duration> {
        self.check_hash(self.hash(key), now)
    }

    /// [`RateLimiter::check`] of the key whose [`RateLimiter::hash`] is `hash`.
    pub fn check_hash(&self, hash: u64, now: Instant) -> Result<(), Duration> {
        let (tag, ways) = self.locate(hash);
        let now_us = self.now_us(now);
        loop {
            let words: [u64; WAYS] = std::array::from_fn(|i| ways[i].load(Ordering::Acquire));
            let (way, tat) = match words.iter().position(|w| w >> TAT_BITS == tag) {
                Some(i) => (i, (words[i] & TAT_MASK).max(now_us)),
                // The victim: the lowest TAT (the first of equals, so that workers racing
                // to insert one key pick the same slot and all but one retry).
                None => (victim(&words), now_us),
            };
            let wait = tat - now_us;
            if wait > self.tolerance_us {
                return Err(Duration::from_micros(wait - self.tolerance_us));
            }
            let new = tag << TAT_BITS | (tat + self.interval_us);
            let swap =
                ways[way].compare_exchange(words[way], new, Ordering::AcqRel, Ordering::Acquire);
            if swap.is_ok() {
                return Ok(());
            }
        }
    }
}

impl RateLimiter {
    /// Takes in the fleet's TAT of the key whose [`RateLimiter::hash`] is `hash` (as the
    /// sync read it: `ahead` of `now`): the key's TAT becomes the later of its own and the
    /// fleet's. Off the request path (the cluster thread).
    pub fn merge(&self, hash: u64, now: Instant, ahead: Duration) {
        let (tag, ways) = self.locate(hash);
        let tat = self
            .now_us(now)
            .saturating_add(ahead.as_micros() as u64)
            .min(TAT_MASK);
        loop {
            let words: [u64; WAYS] = std::array::from_fn(|i| ways[i].load(Ordering::Acquire));
            let way = words
                .iter()
                .position(|w| w >> TAT_BITS == tag)
                .unwrap_or_else(|| victim(&words));
            // The key's own TAT is as late already, or (not held here) the slot it would
            // take holds a key more limited than this one: nothing to take in.
            if words[way] & TAT_MASK >= tat {
                return;
            }
            let new = tag << TAT_BITS | tat;
            let swap =
                ways[way].compare_exchange(words[way], new, Ordering::AcqRel, Ordering::Acquire);
            if swap.is_ok() {
                return;
            }
        }
    }
}

/// The bytes a shared limit notes a client address as (its 4 or 16 octets).
pub fn ip_key(ip: &std::net::IpAddr, out: &mut [u8; 16]) -> usize {
    match ip {
        std::net::IpAddr::V4(a) => {
            out[..4].copy_from_slice(&a.octets());
            4
        }
        std::net::IpAddr::V6(a) => {
            *out = a.octets();
            16
        }
    }
}

/// The address [`ip_key`] wrote (anything else: the unspecified address).
pub fn ip_of(key: &[u8]) -> std::net::IpAddr {
    match key.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(key).unwrap_or_default()),
        _ => std::net::IpAddr::from(<[u8; 16]>::try_from(key).unwrap_or_default()),
    }
}

fn victim(words: &[u64; WAYS]) -> usize {
    let mut best = 0;
    for (i, w) in words.iter().enumerate() {
        if w & TAT_MASK < words[best] & TAT_MASK {
            best = i;
        }
    }
    best
}

/// Seconds for `Retry-After`: the wait rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_config::RateKey;

    fn limiter(per: Duration, burst: u32, max_keys: usize) -> RateLimiter {
        RateLimiter::new(&RateLimit {
            interval: per,
            burst,
            key: RateKey::ClientIp,
            max_keys,
            shared: None,
        })
    }

    #[test]
    fn burst_then_one_per_interval() {
        let l = limiter(Duration::from_secs(1), 3, 64);
        let t0 = l.epoch + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(l.check("a", t0), Ok(()));
        }
        assert_eq!(l.check("a", t0), Err(Duration::from_secs(1)));
        assert_eq!(l.check("b", t0), Ok(()), "keys are separate");
        let later = t0 + Duration::from_millis(400);
        assert_eq!(l.check("a", later), Err(Duration::from_millis(600)));
        assert_eq!(l.check("a", t0 + Duration::from_secs(1)), Ok(()));
        assert!(l.check("a", t0 + Duration::from_secs(1)).is_err());
        // A long pause refills the whole burst, not more.
        let much_later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            assert_eq!(l.check("a", much_later), Ok(()));
        }
        assert!(l.check("a", much_later).is_err());
    }

    #[test]
    fn exact_across_threads() {
        let l = std::sync::Arc::new(limiter(Duration::from_secs(3600), 1000, 64));
        let now = Instant::now();
        let passed: usize = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || (0..1000).filter(|_| l.check(7u32, now).is_ok()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(passed, 1000);
    }

    #[test]
    fn churn_does_not_grow_or_break_active_keys() {
        let l = limiter(Duration::from_secs(3600), 2, 1024);
        let now = Instant::now();
        assert_eq!(l.slots.len(), 1024);
        for ip in 0..100_000u32 {
            let _ = l.check(ip, now);
        }
        assert_eq!(l.slots.len(), 1024, "fixed size");
        // A key limited after the churn stays limited while others come and go.
        let _ = l.check("busy", now);
        let _ = l.check("busy", now);
        assert!(l.check("busy", now).is_err());
        for ip in 100_000..200_000u32 {
            let _ = l.check(ip, now);
        }
        assert!(
            l.check("busy", now).is_err(),
            "a limited key outlives the churn"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3600)), 3600);
    }
}
