//! Weighted least connections: the member with the fewest in-flight requests (this
//! worker's count) relative to its weight. Ties go round robin, so an idle pool is not
//! always served by its first member.

use super::Candidates;

#[derive(Debug, Clone, Default)]
pub struct LeastConnections {
    cursor: usize,
}

impl LeastConnections {
    pub fn pick(&mut self, c: &impl Candidates) -> Option<usize> {
        let n = c.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor % n;
        self.cursor = self.cursor.wrapping_add(1);
        // (member, in_flight, weight) of the best so far.
        let mut best: Option<(usize, u64, u64)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let w = u64::from(c.weight(i));
            if w == 0 {
                continue;
            }
            let active = u64::from(c.in_flight(i));
            // active / w < best_active / best_w, without division.
            if best.is_none_or(|(_, ba, bw)| active * bw < ba * w) {
                best = Some((i, active, w));
            }
        }
        best.map(|(i, _, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    #[test]
    fn fewest_in_flight_wins() {
        let mut lc = LeastConnections::default();
        let mut c = Fixed::new(&[1, 1, 1]);
        c.in_flight = vec![3, 1, 2];
        for _ in 0..5 {
            assert_eq!(lc.pick(&c), Some(1));
        }
    }

    #[test]
    fn weight_scales_the_count() {
        let mut lc = LeastConnections::default();
        let mut c = Fixed::new(&[1, 4]);
        // 2/1 > 6/4: the heavier server still wins with more connections.
        c.in_flight = vec![2, 6];
        assert_eq!(lc.pick(&c), Some(1));
        c.in_flight = vec![1, 6];
        assert_eq!(lc.pick(&c), Some(0));
    }

    #[test]
    fn ties_rotate_and_unavailable_members_are_skipped() {
        let mut lc = LeastConnections::default();
        let c = Fixed::new(&[1, 1, 1]);
        let picks: Vec<_> = (0..3).map(|_| lc.pick(&c).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2]);
        let mut c = Fixed::new(&[1, 0, 1]);
        c.in_flight = vec![5, 0, 5];
        assert!(matches!(lc.pick(&c), Some(0 | 2)));
        assert_eq!(lc.pick(&Fixed::new(&[0])), None);
    }

    /// Simulated: member 0 holds its requests 10x longer; it ends up with far fewer picks.
    #[test]
    fn favours_the_member_not_holding_slow_requests() {
        let mut lc = LeastConnections::default();
        let mut c = Fixed::new(&[1, 1]);
        let mut done_at: Vec<(u32, usize)> = Vec::new();
        let mut picks = [0u32; 2];
        for tick in 0..1000u32 {
            done_at.retain(|&(t, m)| {
                let keep = t > tick;
                if !keep {
                    c.in_flight[m] -= 1;
                }
                keep
            });
            let m = lc.pick(&c).unwrap();
            picks[m] += 1;
            c.in_flight[m] += 1;
            done_at.push((tick + if m == 0 { 20 } else { 2 }, m));
        }
        assert!(picks[1] > picks[0] * 5, "{picks:?}");
    }
}
