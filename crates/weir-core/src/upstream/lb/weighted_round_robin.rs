//! Smooth weighted round robin, nginx's algorithm (`ngx_http_upstream_get_peer`).
//!
//! Each pick adds every available member's effective weight to its current weight, picks
//! the member with the highest current weight, and subtracts the total from it. Weights
//! 5:1:1 give `a a b a c a a` rather than `a a a a a b c`: no burst to the heavy server,
//! and over `sum(weights)` picks each member gets exactly its weight.

use super::Candidates;

#[derive(Debug, Clone, Default)]
pub struct SmoothWeighted {
    current: Vec<i64>,
}

impl SmoothWeighted {
    pub fn pick(&mut self, c: &impl Candidates) -> Option<usize> {
        let n = c.len();
        if self.current.len() != n {
            self.current = vec![0; n];
        }
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for i in 0..n {
            let w = i64::from(c.weight(i));
            if w == 0 {
                continue;
            }
            self.current[i] += w;
            total += w;
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    #[test]
    fn smooth_sequence_matches_nginx() {
        let mut wrr = SmoothWeighted::default();
        let c = Fixed::new(&[5, 1, 1]);
        let picks: Vec<_> = (0..7).map(|_| wrr.pick(&c).unwrap()).collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn weights_one_two_three_exactly_over_6000_picks() {
        let mut wrr = SmoothWeighted::default();
        let c = Fixed::new(&[1, 2, 3]);
        let mut counts = [0u32; 3];
        for _ in 0..6000 {
            counts[wrr.pick(&c).unwrap()] += 1;
        }
        assert_eq!(counts, [1000, 2000, 3000]);
    }

    /// Never more than the weight's share: after any number of picks k, member i has
    /// been picked within one of k x w_i / total times (so any window of `total` picks
    /// holds w_i +- 1 of them), and its longest run is at most ceil(w_i / (total - w_i)) + 1
    /// (a plain weighted round robin would send w_i in a row).
    #[test]
    fn never_bursts_beyond_the_weights_share() {
        for weights in [
            vec![1, 2, 3],
            vec![5, 1, 1],
            vec![10, 5],
            vec![3, 3, 3],
            vec![7, 1],
        ] {
            let mut wrr = SmoothWeighted::default();
            let c = Fixed::new(&weights);
            let total: u32 = weights.iter().sum();
            let mut counts = vec![0u32; weights.len()];
            let (mut last, mut run) = (usize::MAX, 0u32);
            for k in 1..=total * 50 {
                let p = wrr.pick(&c).unwrap();
                counts[p] += 1;
                run = if p == last { run + 1 } else { 1 };
                last = p;
                let w = weights[p];
                let limit = w.div_ceil(total - w) + 1;
                assert!(run <= limit, "{weights:?}: {run} picks of {p} in a row");
                for (i, &w) in weights.iter().enumerate() {
                    let ideal = f64::from(k * w) / f64::from(total);
                    let off = (f64::from(counts[i]) - ideal).abs();
                    assert!(
                        off < 1.0,
                        "{weights:?}: member {i} after {k} picks: {counts:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unavailable_members_are_skipped() {
        let mut wrr = SmoothWeighted::default();
        let c = Fixed::new(&[3, 0, 1]);
        let mut counts = [0u32; 3];
        for _ in 0..400 {
            counts[wrr.pick(&c).unwrap()] += 1;
        }
        assert_eq!(counts, [300, 0, 100]);
        assert_eq!(wrr.pick(&Fixed::new(&[0, 0, 0])), None);
    }
}
