//! Rise / fall counting: `rise` consecutive successes mark a down server up, `fall`
//! consecutive failures mark an up server down; a result agreeing with the current state
//! resets the streak.

#[derive(Debug, Clone)]
pub struct RiseFall {
    rise: u32,
    fall: u32,
    up: bool,
    /// Consecutive results contradicting `up`.
    streak: u32,
}

impl RiseFall {
    pub fn new(rise: u32, fall: u32, up: bool) -> RiseFall {
        RiseFall {
            rise: rise.max(1),
            fall: fall.max(1),
            up,
            streak: 0,
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Counts one check result; returns the new state when it changes.
    pub fn record(&mut self, ok: bool) -> Option<bool> {
        if ok == self.up {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if self.up { self.fall } else { self.rise };
        if self.streak < needed {
            return None;
        }
        self.up = ok;
        self.streak = 0;
        Some(ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_after_fall_failures_in_a_row() {
        let mut c = RiseFall::new(2, 3, true);
        assert_eq!(c.record(false), None);
        assert_eq!(c.record(false), None);
        assert_eq!(c.record(true), None, "a success resets the streak");
        assert_eq!(c.record(false), None);
        assert_eq!(c.record(false), None);
        assert_eq!(c.record(false), Some(false));
        assert!(!c.is_up());
        assert_eq!(c.record(false), None, "no repeated transition");
    }

    #[test]
    fn rises_after_rise_successes_in_a_row() {
        let mut c = RiseFall::new(2, 3, false);
        assert_eq!(c.record(true), None);
        assert_eq!(c.record(false), None);
        assert_eq!(c.record(true), None);
        assert_eq!(c.record(true), Some(true));
        assert!(c.is_up());
    }

    #[test]
    fn vproxy_up_1_down_5() {
        let mut c = RiseFall::new(1, 5, true);
        for _ in 0..4 {
            assert_eq!(c.record(false), None);
        }
        assert_eq!(c.record(false), Some(false));
        assert_eq!(c.record(true), Some(true), "up 1: one success is enough");
    }
}
