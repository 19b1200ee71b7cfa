//! Weighted splits of a route over several upstream pools (`upstreams = [{ name, weight }]`).
//!
//! The order is decided once per snapshot: nginx's smooth weighted round robin
//! (`lb::weighted_round_robin`) run over one period of `sum(weights) / gcd` picks gives a
//! schedule where every pool gets exactly its weight per period, spread out (95:5 sends
//! one request in twenty to the second pool, not five in a row). Each worker walks the
//! schedule with its own cursor per route: no lock, no shared counter, and a split that is
//! exact per worker after every whole period.
//!
//! With `split_fallback` (the default), a pick that lands on a pool with no usable server
//! (all down by the active check or passively ejected) goes on along the schedule to the
//! next pool that has one, so a dead canary's share goes to the other pools in their
//! proportions instead of failing with 502/503. Healthy pools cost one check per request.

use std::cell::RefCell;

use weir_config::WeightedUpstream;

use super::lb::weighted_round_robin::SmoothWeighted;
use super::lb::Fixed;
use super::pool::UpstreamPlan;

/// The schedule of one split route.
#[derive(Debug, Clone)]
pub struct Split {
    /// Upstream indices (into the config's upstreams), one per pick of a period.
    schedule: Box<[usize]>,
    /// `split_fallback`: skip pools without a usable server.
    fallback: bool,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Split {
    pub fn new(pools: &[WeightedUpstream], fallback: bool) -> Split {
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
        Split { schedule, fallback }
    }

    /// The upstream for the request with this worker's `cursor` for the route; `plans`:
    /// the snapshot's upstream plans, whose health decides a fallback.
    #[inline]
    pub fn pick(&self, cursor: u64, plans: &[UpstreamPlan]) -> usize {
        self.pick_where(cursor, |u| {
            plans.get(u).is_none_or(UpstreamPlan::has_usable_server)
        })
    }

    fn pick_where(&self, cursor: u64, usable: impl Fn(usize) -> bool) -> usize {
        // The schedule has at least one entry: validation keeps weights >= 1.
        let len = self.schedule.len().max(1);
        let at = |step: usize| {
            let i = (cursor % len as u64) as usize;
            self.schedule.get((i + step) % len).copied().unwrap_or(0)
        };
        let first = at(0);
        if !self.fallback || usable(first) {
            return first;
        }
        // On along the schedule: the remaining pools keep their proportions.
        (1..len)
            .map(at)
            .find(|&u| u != first && usable(u))
            .unwrap_or(first)
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
        Split::new(&pools, true)
    }

    #[test]
    fn exact_shares_over_whole_periods() {
        let s = split(&[(7, 95), (3, 5)]);
        let picks: Vec<usize> = (0..1000).map(|c| s.pick_where(c, |_| true)).collect();
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
        let picks: Vec<usize> = (0..6).map(|c| s.pick_where(c, |_| true)).collect();
        assert_eq!(picks.iter().filter(|u| **u == 0).count(), 3);
        assert_eq!(picks.iter().filter(|u| **u == 2).count(), 1);
        assert_eq!(split(&[(4, 1)]).pick_where(123, |_| true), 4);
    }

    /// Was: a canary pool with no healthy server kept its share, as 502s.
    #[test]
    fn a_pool_without_usable_servers_hands_its_share_on() {
        let s = split(&[(0, 90), (1, 5), (2, 5)]);
        let picks: Vec<usize> = (0..200).map(|c| s.pick_where(c, |u| u != 2)).collect();
        assert!(!picks.contains(&2));
        assert_eq!(
            picks.iter().filter(|u| **u == 1).count(),
            10,
            "pool 1 keeps its share"
        );
        let mut off = split(&[(0, 95), (1, 5)]);
        off.fallback = false;
        let picks: Vec<usize> = (0..20).map(|c| off.pick_where(c, |u| u != 1)).collect();
        assert_eq!(
            picks.iter().filter(|u| **u == 1).count(),
            1,
            "off: the share stays"
        );
        let all_down: Vec<usize> = (0..20).map(|c| s.pick_where(c, |_| false)).collect();
        assert_eq!(
            all_down,
            (0..20)
                .map(|c| s.pick_where(c, |_| true))
                .collect::<Vec<_>>()
        );
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
