//! Weighted splits of a route over several upstream pools (`upstreams = [{ name, weight }]`).
//!
//! The order is decided once per snapshot: nginx's smooth weighted round robin
//! (`lb::weighted_round_robin`) run over one period of `sum(weights) / gcd` picks gives a
//! schedule where every pool gets exactly its weight per period, spread out (95:5 sends
//! one request in twenty to the second pool, not five in a row). Each worker walks the
//! schedule with its own cursor per route: no lock, no shared counter, and a split that is
//! exact per worker after every whole period.

use std::cell::RefCell;

use weir_config::WeightedUpstream;

use super::lb::weighted_round_robin::SmoothWeighted;
use super::lb::Fixed;

/// The schedule of one split route.
#[derive(Debug, Clone)]
pub struct Split {
    /// Upstream indices (into the config's upstreams), one per pick of a period.
    schedule: Box<[usize]>,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Split {
    pub fn new(pools: &[WeightedUpstream]) -> Split {
        let divisor = pools.iter().fold(0, |g, p| gcd(g, p.weight)).max(1);
        let weights: Vec<u32> = pools.iter().map(|p| p.weight / divisor).collect();
        let period: u32 = weights.iter().sum();
        let fixed = Fixed::new(&weights);
        let mut wrr = SmoothWeighted::default();
        let schedule = (0..period)
            .map(|_| {
                wrr.pick(&fixed)
                    .map_or(pools[0].upstream, |i| pools[i].upstream)
            })
            .collect();
        Split { schedule }
    }

    /// The upstream for the request with this worker's `cursor` for the route.
    #[inline]
    pub fn pick(&self, cursor: u64) -> usize {
        // The schedule has at least one entry: validation keeps weights >= 1.
        let len = self.schedule.len().max(1) as u64;
        self.schedule
            .get((cursor % len) as usize)
            .copied()
            .unwrap_or(0)
    }
}

/// One worker's position in each split route's schedule, by listener and route metric slot
/// (slots are stable across reloads, so a reload does not restart the schedules).
#[derive(Debug, Default)]
pub struct SplitCursors {
    cursors: RefCell<Vec<Vec<u64>>>,
}

impl SplitCursors {
    /// The cursor for the route with slot `route` of the listener with slot `listener`,
    /// advanced for the next request.
    pub fn next(&self, listener: usize, route: usize) -> u64 {
        let mut cursors = self.cursors.borrow_mut();
        if cursors.len() <= listener {
            cursors.resize_with(listener + 1, Vec::new);
        }
        let routes = &mut cursors[listener];
        if routes.len() <= route {
            routes.resize(route + 1, 0);
        }
        let cursor = routes[route];
        routes[route] = cursor.wrapping_add(1);
        cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(weights: &[(usize, u32)]) -> Split {
        let pools: Vec<WeightedUpstream> = weights
            .iter()
            .map(|&(upstream, weight)| WeightedUpstream { upstream, weight })
            .collect();
        Split::new(&pools)
    }

    #[test]
    fn exact_shares_over_whole_periods() {
        let s = split(&[(7, 95), (3, 5)]);
        let picks: Vec<usize> = (0..1000).map(|c| s.pick(c)).collect();
        assert_eq!(picks.iter().filter(|u| **u == 7).count(), 950);
        assert_eq!(picks.iter().filter(|u| **u == 3).count(), 50);
        // Spread out: never two picks of the small pool within 19 requests.
        let small: Vec<usize> = (0..1000).filter(|&i| picks[i] == 3).collect();
        assert!(small.windows(2).all(|w| w[1] - w[0] == 20), "{small:?}");
    }

    #[test]
    fn weights_reduce_by_their_gcd() {
        let s = split(&[(0, 300), (1, 200), (2, 100)]);
        assert_eq!(s.schedule.len(), 6);
        let picks: Vec<usize> = (0..6).map(|c| s.pick(c)).collect();
        assert_eq!(picks.iter().filter(|u| **u == 0).count(), 3);
        assert_eq!(picks.iter().filter(|u| **u == 2).count(), 1);
        assert_eq!(split(&[(4, 1)]).pick(123), 4);
    }

    #[test]
    fn cursors_count_per_route() {
        let c = SplitCursors::default();
        assert_eq!(
            (c.next(1, 2), c.next(1, 2), c.next(0, 2), c.next(1, 2)),
            (0, 1, 0, 2)
        );
    }
}
