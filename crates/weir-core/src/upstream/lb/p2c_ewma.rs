//! Power of two choices over peak-EWMA latency (Finagle's and Linkerd's `PeakEwma`).
//!
//! Each pick draws two different members at random and takes the cheaper one, where
//! cost = latency estimate x (in-flight + 1) / weight. The estimate jumps up to any slower
//! observation at once (the "peak") and decays towards faster ones with time constant
//! [`DECAY`]; while a member is not observed its estimate decays towards 0, so a member
//! that was slow once is tried again later. A member never measured costs 0 while idle
//! (it gets explored) and [`PENALTY_NS`] while it has requests in flight.
//!
//! Time is passed in (nanoseconds on any monotonic clock), so the unit is pure.

use std::time::Duration;

use super::rng::XorShift;
use super::Candidates;

/// The EWMA's time constant.
pub const DECAY: Duration = Duration::from_secs(10);
/// The cost of a member with requests in flight but no latency sample yet.
pub const PENALTY_NS: f64 = 1e9;

/// One member's latency estimate.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeakEwma {
    estimate_ns: f64,
    stamp_ns: u64,
}

impl PeakEwma {
    /// Records one observed latency (time to the response head, or a penalty on failure).
    pub fn observe(&mut self, rtt: Duration, now_ns: u64) {
        let rtt = rtt.as_nanos() as f64;
        let w = decay_weight(now_ns.saturating_sub(self.stamp_ns));
        self.estimate_ns = if rtt > self.estimate_ns {
            rtt
        } else {
            self.estimate_ns * w + rtt * (1.0 - w)
        };
        self.stamp_ns = now_ns;
    }

    /// The estimate at `now_ns`, decayed towards 0 since the last observation.
    pub fn estimate_ns(&self, now_ns: u64) -> f64 {
        self.estimate_ns * decay_weight(now_ns.saturating_sub(self.stamp_ns))
    }
}

fn decay_weight(elapsed_ns: u64) -> f64 {
    (-(elapsed_ns as f64) / DECAY.as_nanos() as f64).exp()
}

/// Picks a member; `ewma[i]` is member `i`'s estimate.
pub fn pick(
    rng: &mut XorShift,
    c: &impl Candidates,
    ewma: &[PeakEwma],
    now_ns: u64,
) -> Option<usize> {
    let n = c.len();
    let cost = |i: usize| -> Option<f64> {
        let w = c.weight(i);
        if w == 0 {
            return None;
        }
        let in_flight = f64::from(c.in_flight(i));
        let estimate = ewma.get(i).map_or(0.0, |e| e.estimate_ns(now_ns));
        let cost = if estimate == 0.0 {
            if in_flight == 0.0 {
                0.0
            } else {
                PENALTY_NS * in_flight
            }
        } else {
            estimate * (in_flight + 1.0)
        };
        Some(cost / f64::from(w))
    };
    match n {
        0 => return None,
        1 => return cost(0).map(|_| 0),
        _ => {}
    }
    let a = rng.below(n as u64) as usize;
    let mut b = rng.below(n as u64 - 1) as usize;
    if b >= a {
        b += 1;
    }
    match (cost(a), cost(b)) {
        (Some(ca), Some(cb)) => Some(if cb < ca { b } else { a }),
        (Some(_), None) => Some(a),
        (None, Some(_)) => Some(b),
        // Both drawn members are unavailable: the cheapest of the rest.
        (None, None) => (0..n)
            .filter_map(|i| cost(i).map(|c| (i, c)))
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .map(|(i, _)| i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    const MS: u64 = 1_000_000;

    #[test]
    fn peak_jumps_up_and_decays_down() {
        let mut e = PeakEwma::default();
        e.observe(Duration::from_millis(10), 0);
        assert_eq!(e.estimate_ns(0), 10.0 * MS as f64);
        e.observe(Duration::from_millis(50), MS);
        assert_eq!(
            e.estimate_ns(MS),
            50.0 * MS as f64,
            "a slower sample is taken at once"
        );
        e.observe(Duration::from_millis(1), 5_000 * MS);
        let after = e.estimate_ns(5_000 * MS);
        assert!(
            after < 50.0 * MS as f64 && after > 1.0 * MS as f64,
            "{after}"
        );
        assert!(
            e.estimate_ns(100_000 * MS) < 0.01 * MS as f64,
            "decays while idle"
        );
    }

    /// Two members, one 10x faster; requests arrive one at a time (each finished before
    /// the next starts), as in a sequential client.
    #[test]
    fn a_ten_times_faster_member_gets_at_least_80_percent() {
        let mut rng = XorShift::new(3);
        let c = Fixed::new(&[1, 1]);
        let mut ewma = [PeakEwma::default(); 2];
        let latency = [Duration::from_millis(1), Duration::from_millis(10)];
        let mut now = 0u64;
        let mut picks = [0u32; 2];
        for _ in 0..1000 {
            let m = pick(&mut rng, &c, &ewma, now).unwrap();
            picks[m] += 1;
            now += latency[m].as_nanos() as u64;
            ewma[m].observe(latency[m], now);
        }
        assert!(picks[0] >= 800, "{picks:?}");
    }

    /// With concurrency, in-flight counts spread load: the fast member is preferred, but
    /// not to the point of queueing everything on it.
    #[test]
    fn in_flight_requests_raise_the_cost() {
        let mut rng = XorShift::new(9);
        let mut c = Fixed::new(&[1, 1]);
        let mut ewma = [PeakEwma::default(); 2];
        ewma[0].observe(Duration::from_millis(1), 0);
        ewma[1].observe(Duration::from_millis(3), 0);
        assert_eq!(pick(&mut rng, &c, &ewma, 0), Some(0));
        c.in_flight = vec![5, 0];
        assert_eq!(pick(&mut rng, &c, &ewma, 0), Some(1));
    }

    #[test]
    fn unavailable_members_are_skipped() {
        let mut rng = XorShift::new(11);
        let c = Fixed::new(&[0, 1, 0, 0]);
        let ewma = [PeakEwma::default(); 4];
        for _ in 0..100 {
            assert_eq!(pick(&mut rng, &c, &ewma, 0), Some(1));
        }
        assert_eq!(pick(&mut rng, &Fixed::new(&[0, 0]), &ewma, 0), None);
        assert_eq!(pick(&mut rng, &Fixed::new(&[3]), &ewma, 0), Some(0));
    }
}
