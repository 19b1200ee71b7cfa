//! The shared, per-server state every worker reads when it picks: the active health
//! verdict and the passive-ejection / slow-start marker.
//!
//! Written rarely (a health transition, a failed request), read on every pick with plain
//! relaxed loads. The only read-modify-write operations are on failures and on the
//! rare transition back to full weight; a successful request does at most a load (and a
//! store when it ends a run of failures).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds on a process-wide monotonic clock; never 0 (0 means "no marker").
pub fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

/// Nanoseconds on the same clock (latency estimates).
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// Shared state of one server.
#[derive(Debug)]
pub struct ServerState {
    /// The active health check's verdict (always true without checks). An `Arc` so the
    /// metrics scrape can read the same flag.
    pub up: Arc<AtomicBool>,
    /// 0: normal. Otherwise the `now_ms` at which the server is (again) available: in the
    /// future while it is ejected, in the past while its weight ramps up (slow start).
    since_ms: AtomicU64,
    /// Consecutive failures (passive).
    fails: AtomicU32,
    /// The last active check, for the admin API (never touched by the request path).
    pub last_check: std::sync::Mutex<Option<LastCheck>>,
}

/// When the last active health check ran and, if it failed, why.
#[derive(Debug, Clone)]
pub struct LastCheck {
    pub at: std::time::SystemTime,
    pub failure: Option<String>,
}

impl Default for ServerState {
    fn default() -> ServerState {
        ServerState {
            up: Arc::new(AtomicBool::new(true)),
            since_ms: AtomicU64::new(0),
            fails: AtomicU32::new(0),
            last_check: std::sync::Mutex::new(None),
        }
    }
}

/// The passive-health settings in milliseconds, as the request path uses them.
#[derive(Debug, Clone, Copy)]
pub struct Passive {
    pub max_fails: u32,
    pub fail_timeout_ms: u64,
    pub slow_start_ms: u64,
}

impl Passive {
    pub fn new(p: &weir_config::PassiveHealth) -> Passive {
        Passive {
            max_fails: p.max_fails,
            fail_timeout_ms: p.fail_timeout.as_millis() as u64,
            slow_start_ms: p.slow_start.as_millis() as u64,
        }
    }
}

impl ServerState {
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// Whether anything (ejection, slow start) changes the weight: when false, the pick
    /// needs no clock.
    pub fn is_normal(&self) -> bool {
        self.since_ms.load(Relaxed) == 0
    }

    /// The effective weight at `now`: 0 while ejected (unless `ignore_ejection`), ramping
    /// linearly from 1 to `base` over the slow start, else `base`.
    pub fn weight(&self, base: u32, now: u64, passive: &Passive, ignore_ejection: bool) -> u32 {
        let since = self.since_ms.load(Relaxed);
        if since == 0 {
            return base;
        }
        if now < since {
            return if ignore_ejection { base } else { 0 };
        }
        let elapsed = now - since;
        if elapsed >= passive.slow_start_ms {
            // Back to normal; a concurrent new ejection wins over this reset.
            let _ = self.since_ms.compare_exchange(since, 0, Relaxed, Relaxed);
            return base;
        }
        ((u64::from(base) * elapsed / passive.slow_start_ms) as u32).max(1)
    }

    /// Counts a failed request; returns true when this failure ejects the server.
    pub fn record_failure(&self, now: u64, passive: &Passive) -> bool {
        if passive.max_fails == 0 {
            return false;
        }
        let fails = self.fails.fetch_add(1, Relaxed) + 1;
        if fails < passive.max_fails {
            return false;
        }
        self.fails.store(0, Relaxed);
        self.since_ms.store(now + passive.fail_timeout_ms, Relaxed);
        true
    }

    /// Counts a successful request: ends a run of failures (a store only if there was one).
    pub fn record_success(&self) {
        if self.fails.load(Relaxed) != 0 {
            self.fails.store(0, Relaxed);
        }
    }

    /// The active check marked the server up or down. Coming up starts a slow start.
    pub fn set_up(&self, up: bool, now: u64, passive: &Passive) {
        self.up.store(up, Relaxed);
        if up {
            self.fails.store(0, Relaxed);
            let since = if passive.slow_start_ms > 0 { now } else { 0 };
            self.since_ms.store(since, Relaxed);
        }
    }

    /// Notes an active check's result (`failure`: its reason) for the admin API.
    pub fn record_check(&self, failure: Option<String>) {
        let last = LastCheck {
            at: std::time::SystemTime::now(),
            failure,
        };
        *self.last_check.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
    }

    /// Time left of an ejection at `now`, if the server is ejected.
    pub fn ejected_for(&self, now: u64) -> Option<Duration> {
        let since = self.since_ms.load(Relaxed);
        (since > now).then(|| Duration::from_millis(since - now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Passive = Passive {
        max_fails: 3,
        fail_timeout_ms: 10_000,
        slow_start_ms: 10_000,
    };

    #[test]
    fn ejects_after_max_fails_in_a_row() {
        let s = ServerState::default();
        assert!(!s.record_failure(100, &P));
        assert!(!s.record_failure(100, &P));
        s.record_success();
        assert!(!s.record_failure(100, &P));
        assert!(!s.record_failure(100, &P));
        assert!(s.record_failure(100, &P), "third in a row");
        assert_eq!(s.weight(16, 5_000, &P, false), 0, "ejected");
        assert_eq!(
            s.weight(16, 5_000, &P, true),
            16,
            "panic mode ignores ejection"
        );
        assert_eq!(s.ejected_for(5_000), Some(Duration::from_millis(5_100)));
    }

    #[test]
    fn slow_start_ramps_the_weight_back() {
        let s = ServerState::default();
        let p = Passive { max_fails: 1, ..P };
        assert!(s.record_failure(0, &p));
        // Ejected until 10_000, then ramps over 10_000 ms.
        assert_eq!(s.weight(160, 10_000, &p, false), 1);
        assert_eq!(s.weight(160, 12_500, &p, false), 40);
        assert_eq!(s.weight(160, 15_000, &p, false), 80);
        assert!(!s.is_normal());
        assert_eq!(s.weight(160, 20_000, &p, false), 160);
        assert!(s.is_normal(), "back to normal after the ramp");
    }

    #[test]
    fn passive_off_and_no_slow_start() {
        let s = ServerState::default();
        let off = Passive { max_fails: 0, ..P };
        for _ in 0..10 {
            assert!(!s.record_failure(0, &off));
        }
        assert!(s.is_normal());
        let quick = Passive {
            max_fails: 1,
            slow_start_ms: 0,
            ..P
        };
        assert!(s.record_failure(0, &quick));
        assert_eq!(s.weight(16, 10_000, &quick, false), 16);
    }

    #[test]
    fn active_transitions() {
        let s = ServerState::default();
        assert!(s.is_up());
        s.set_up(false, 100, &P);
        assert!(!s.is_up());
        s.set_up(true, 1_000, &P);
        assert!(s.is_up());
        assert_eq!(
            s.weight(100, 6_000, &P, false),
            50,
            "slow start after coming up"
        );
    }
}
