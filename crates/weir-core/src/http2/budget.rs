//! The per-connection budgets of misbehaviour, in a sliding window: resets (rapid reset,
//! CVE-2023-44487, and the resets a client's errors force, MadeYouReset, CVE-2025-8671)
//! and glitches (frames that cost work but carry no request, `frames::glitch`).
//!
//! The `h2` crate's own guard (`max_pending_accept_reset_streams`) counts only streams
//! reset before they were accepted; a client that lets each stream be accepted and sent
//! upstream before resetting it costs Weir an upstream request per reset. Each such reset
//! here adds `window / budget` of debt that drains with real time (a GCRA, so the window
//! slides: `budget` resets fit in any `window`, and a burst of `budget` after a quiet
//! `window` is fine). Past it the connection gets GOAWAY ENHANCE_YOUR_CALM.

use std::cell::Cell;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub struct Budget {
    /// The debt one reset adds.
    cost: Duration,
    window: Duration,
    /// When the debt so far will have drained.
    clear_at: Cell<Option<Instant>>,
    exceeded: Cell<bool>,
    /// Wakes the connection task when the budget is exceeded.
    pub notify: Notify,
}

impl Budget {
    pub fn new(budget: u32, window: Duration) -> Budget {
        Budget {
            cost: window / budget.max(1),
            window,
            clear_at: Cell::new(None),
            exceeded: Cell::new(false),
            notify: Notify::new(),
        }
    }

    /// Counts one event at `now`; true once the budget is exceeded.
    pub fn record(&self, now: Instant) -> bool {
        let from = self.clear_at.get().filter(|t| *t > now).unwrap_or(now);
        let clear_at = from + self.cost;
        self.clear_at.set(Some(clear_at));
        if clear_at.saturating_duration_since(now) > self.window {
            self.exceeded.set(true);
            self.notify.notify_one();
        }
        self.exceeded.get()
    }

    pub fn is_exceeded(&self) -> bool {
        self.exceeded.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_resets_fit_in_a_window_and_one_more_does_not() {
        let b = Budget::new(10, Duration::from_secs(10));
        let t = Instant::now();
        for _ in 0..10 {
            assert!(!b.record(t));
        }
        assert!(b.record(t));
    }

    #[test]
    fn the_window_slides() {
        let b = Budget::new(10, Duration::from_secs(10));
        let t = Instant::now();
        // One reset a second, forever, stays within 10 per 10 s.
        for s in 0..100 {
            assert!(!b.record(t + Duration::from_secs(s)), "second {s}");
        }
        // A burst of 10 after a quiet window is fine, an eleventh is not.
        let later = t + Duration::from_secs(200);
        for _ in 0..10 {
            assert!(!b.record(later));
        }
        assert!(b.record(later + Duration::from_millis(1)));
    }
}
